"""streamwhiten: streaming BERT-whitening for embedding collections larger than memory.

The public API (everything a user imports; documentation and examples import nothing else):

>>> import streamwhiten
>>> sorted(name for name in streamwhiten.__all__ if not name.endswith("Error"))  # doctest: +NORMALIZE_WHITESPACE
['ApplyOptions', 'ApplyOutcome', 'EngineOptions', 'ExportResult', 'FitOptions', 'FitOutcome', 'Model',
 'PairsResult', 'Publication', 'ReadOptions', 'RetrievalOptions', 'RetrievalResult', 'Setting', 'Staleness',
 'Whitener', '__version__', 'apply', 'evaluate', 'evaluate_retrieval', 'export', 'fit', 'load_model',
 'published', 'release_buffers', 'serving', 'staleness', 'synthetic', 'with_codes']
>>> issubclass(streamwhiten.BadInputError, streamwhiten.StreamwhitenError)
True

- :func:`fit` and :func:`apply`: the pipeline of the command line, on stores of any size; :func:`with_codes`
  (a model with a vector code as its storage);
- :func:`load_model` and :class:`Model` (a fitted whitening and its statistics), :func:`staleness` (how far a
  published map is from a refit: a :class:`Staleness`), :func:`published` (the current :class:`Publication`
  of a job's versioned outputs, read through its manifest);
- :func:`evaluate` (labelled pairs: a :class:`PairsResult`) and :func:`evaluate_retrieval` (queries, corpus
  and qrels: a :class:`RetrievalResult`);
- :mod:`export` (``export.export(model, "whiten.onnx")``: numpy, torch, sentence-transformers, faiss, ONNX;
  an :class:`ExportResult`) and :mod:`serving` (the map in numpy alone); :mod:`synthetic` (the built-in
  anisotropic example data);
- :class:`Whitener`, the scikit-learn transformer;
- the exception family: :class:`StreamwhitenError` and its kinds (:class:`BadInputError`,
  :class:`NothingToDoError`, :class:`LockedError`, :class:`StoreIOError`, ...), each with the exit code the
  command line uses (``streamwhiten.errors`` holds the codes);
- the option objects :class:`ReadOptions`, :class:`FitOptions`, :class:`ApplyOptions`,
  :class:`EngineOptions`, :class:`Setting`, :class:`RetrievalOptions` (what ``evaluate_retrieval`` reads), and the outcomes :class:`FitOutcome`, :class:`ApplyOutcome`.

Every result is a frozen dataclass whose ``to_json()`` gives plain JSON values: what the command's
``--json`` prints.

``import streamwhiten`` stays light: each name is imported on first use (the estimator pulls in numba
and scikit-learn, the pipeline the storage libraries).
"""

__version__ = "0.2.0"

#: Where each public name is defined: (module, name there).
_PUBLIC = {
    "fit": ("streamwhiten.pipeline", "fit"),
    "apply": ("streamwhiten.pipeline", "apply"),
    "with_codes": ("streamwhiten.pipeline", "with_codes"),
    "FitOutcome": ("streamwhiten.pipeline", "FitOutcome"),
    "ApplyOutcome": ("streamwhiten.engine.apply", "ApplyOutcome"),
    "load_model": ("streamwhiten.core.model", "load_model"),
    "Model": ("streamwhiten.core.model", "WhiteningModel"),
    "staleness": ("streamwhiten.core.staleness", "staleness"),
    "Staleness": ("streamwhiten.core.staleness", "Staleness"),
    "published": ("streamwhiten.job.publication", "published"),
    "Publication": ("streamwhiten.job.publication", "Publication"),
    "evaluate": ("streamwhiten.evaluation.evaluate", "evaluate"),
    "evaluate_retrieval": ("streamwhiten.evaluation.retrieval", "evaluate_retrieval"),
    "PairsResult": ("streamwhiten.evaluation.evaluate", "PairsResult"),
    "RetrievalResult": ("streamwhiten.evaluation.retrieval", "RetrievalResult"),
    "export": ("streamwhiten.export", None),
    "ExportResult": ("streamwhiten.export", "ExportResult"),
    "serving": ("streamwhiten.serving", None),
    "synthetic": ("streamwhiten.synthetic", None),
    "Whitener": ("streamwhiten.whitener", "Whitener"),
    "release_buffers": ("streamwhiten._buffers", "release_buffers"),
    "ReadOptions": ("streamwhiten.options", "ReadOptions"),
    "FitOptions": ("streamwhiten.options", "FitOptions"),
    "ApplyOptions": ("streamwhiten.options", "ApplyOptions"),
    "EngineOptions": ("streamwhiten.options", "EngineOptions"),
    "Setting": ("streamwhiten.options", "Setting"),
    "RetrievalOptions": ("streamwhiten.options", "RetrievalOptions"),
    # the exception family (each kind carries its exit code: docs/exit-codes.md)
    "StreamwhitenError": ("streamwhiten.errors", "StreamwhitenError"),
    "BadInputError": ("streamwhiten.errors", "BadInputError"),
    "NonFiniteError": ("streamwhiten.errors", "NonFiniteError"),
    "ValuesTooLargeError": ("streamwhiten.errors", "ValuesTooLargeError"),
    "CorruptStoreError": ("streamwhiten.errors", "CorruptStoreError"),
    "MissingChunkError": ("streamwhiten.errors", "MissingChunkError"),
    "ModelFileError": ("streamwhiten.errors", "ModelFileError"),
    "OutputExistsError": ("streamwhiten.errors", "OutputExistsError"),
    "ForeignOutputError": ("streamwhiten.errors", "ForeignOutputError"),
    "NotFittedError": ("streamwhiten.errors", "NotFittedError"),
    "NothingToDoError": ("streamwhiten.errors", "NothingToDoError"),
    "LockedError": ("streamwhiten.errors", "LockedError"),
    "StoreIOError": ("streamwhiten.errors", "StoreIOError"),
    "InterruptedRunError": ("streamwhiten.errors", "InterruptedRunError"),
    "ClusterError": ("streamwhiten.errors", "ClusterError"),
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attribute = _PUBLIC[name]
    loaded = importlib.import_module(module)
    return loaded if attribute is None else getattr(loaded, attribute)


def __dir__():
    return sorted(set(globals()) | set(__all__))

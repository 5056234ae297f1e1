"""streamwhiten: streaming BERT-whitening for embedding collections larger than memory.

The public API (everything a user imports; documentation and examples import nothing else):

>>> import streamwhiten
>>> sorted(name for name in streamwhiten.__all__ if not name.endswith("Error"))  # doctest: +NORMALIZE_WHITESPACE
['ApplyOptions', 'ApplyOutcome', 'EngineOptions', 'ExportResult', 'FitOptions', 'FitOutcome', 'Model',
 'PairsResult', 'Publication', 'ReadOptions', 'RetrievalOptions', 'RetrievalResult', 'Setting', 'Staleness',
 'Storage', 'Watch', 'Whitener', '__version__', 'apply', 'evaluate', 'evaluate_retrieval', 'export', 'fit',
 'load_model',
 'published', 'release_buffers', 'serving', 'staleness', 'synthetic', 'with_codes']
>>> issubclass(streamwhiten.BadInputError, streamwhiten.StreamwhitenError)
True

- [`fit`][streamwhiten.pipeline.fit] and [`apply`][streamwhiten.pipeline.apply]: the pipeline of the command line, on
  stores of any size; [`with_codes`][streamwhiten.pipeline.with_codes]
  (a model with a vector code as its storage);
- [`load_model`][streamwhiten.core.model.load_model] and [`Model`][streamwhiten.core.model.WhiteningModel] (a fitted
  whitening and its statistics), [`staleness`][streamwhiten.core.staleness.staleness] (how far a
  published map is from a refit: a [`Staleness`][streamwhiten.core.staleness.Staleness]),
  [`published`][streamwhiten.job.publication.published] (the current
  [`Publication`][streamwhiten.job.publication.Publication]
  of a job's versioned outputs, read through its manifest);
- [`evaluate`][streamwhiten.evaluation.evaluate.evaluate] (labelled pairs: a
  [`PairsResult`][streamwhiten.evaluation.evaluate.PairsResult]) and
  [`evaluate_retrieval`][streamwhiten.evaluation.retrieval.evaluate_retrieval] (queries, corpus
  and qrels: a [`RetrievalResult`][streamwhiten.evaluation.retrieval.RetrievalResult]);
- [`export`][streamwhiten.export] (``export.export(model, "whiten.onnx")``: numpy, torch, sentence-transformers, faiss,
  ONNX;
  an [`ExportResult`][streamwhiten.export.ExportResult]) and [`serving`][streamwhiten.serving] (the map in numpy alone);
  [`synthetic`][streamwhiten.synthetic] (the built-in
  anisotropic example data);
- [`Whitener`][streamwhiten.whitener.Whitener], the scikit-learn transformer;
- the exception family: `StreamwhitenError` and its kinds (`BadInputError`, `NothingToDoError`,
  `LockedError`, `StoreIOError`, ...), each with the exit code the command line uses (``streamwhiten.errors``
  holds the codes);
- the option objects [`ReadOptions`][streamwhiten.options.ReadOptions], [`FitOptions`][streamwhiten.options.FitOptions],
  [`ApplyOptions`][streamwhiten.options.ApplyOptions],
  [`EngineOptions`][streamwhiten.options.EngineOptions], [`Setting`][streamwhiten.options.Setting],
  [`RetrievalOptions`][streamwhiten.options.RetrievalOptions] (what ``evaluate_retrieval`` reads),
  [`Storage`][streamwhiten.storage.Storage] (how outputs are stored, parsed once from its spelling:
  `ApplyOptions(dtype="eigen:24")` and every call that takes a storage do it),
  [`Watch`][streamwhiten.progress.Watch] (how ``fit`` and ``apply`` report their progress and are asked to stop),
  and the outcomes
  [`FitOutcome`][streamwhiten.pipeline.FitOutcome], [`ApplyOutcome`][streamwhiten.engine.apply.ApplyOutcome].

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
    "Storage": ("streamwhiten.storage", "Storage"),
    "Watch": ("streamwhiten.progress", "Watch"),
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

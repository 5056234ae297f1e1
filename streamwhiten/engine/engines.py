"""One interface for the serial engine (worker threads here) and the Dask engine (a cluster): the same
`FitPlan` in, the same `FitResult` and ``ApplyOutcome`` out; what differs is said by capabilities, never
by comparing names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import BadInputError
from ..options import ApplyOptions, EngineOptions, ReadOptions
from ..progress import Watch

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..io import Source
    from .apply import ApplyOutcome, ApplyPart
    from .fit import Checkpoint, FitPlan, FitResult


class Engine(ABC):
    """What runs blocks: the same plan in, the same result out, whichever engine."""

    #: the name given to ``--engine``
    name: ClassVar[str]
    #: a fit is checkpointed: it resumes where it stopped, and can update a saved model
    checkpoints: ClassVar[bool]
    #: a signal can wait for the next block boundary (the work then saves and stops cleanly); otherwise
    #: a signal interrupts the work at once, and only the final save can make it wait
    stops_between_blocks: ClassVar[bool]
    #: the output kinds an apply writes (None: every kind ``io`` writes)
    output_kinds: ClassVar[tuple[str, ...] | None] = None

    @abstractmethod
    def fit(self, plan: FitPlan, *, watch: Watch = Watch(), checkpoint: Checkpoint | None = None) -> FitResult:
        """Fold every remaining block of ``plan``; ``watch`` reports progress and asks to stop, ``checkpoint``
        says where and how often an engine that checkpoints saves."""

    @abstractmethod
    def apply(
        self,
        model: WhiteningModel,
        input_spec: str | Source,
        output_spec: str,
        options: ApplyOptions,
        read: ReadOptions,
        *,
        part: ApplyPart | None = None,
        watch: Watch = Watch(),
    ) -> ApplyOutcome:
        """Write ``model``'s transform of every row of ``input_spec`` (or those ``part`` names, its attributes
        recorded beside the output's) to ``output_spec``; ``watch`` reports progress and asks to stop."""

    #: apply options this engine does not take, each with the message that refuses it
    serial_only: ClassVar[dict[str, str]] = {}

    def check_apply(self, options: ApplyOptions, given: tuple[str, ...] = ()) -> None:
        """Refuse apply options this engine cannot honour: one not at its default, or named in ``given``."""
        defaults = ApplyOptions()
        for name, message in self.serial_only.items():
            if name in given or getattr(options, name) != getattr(defaults, name):
                raise BadInputError(message, param=name)


class SerialEngine(Engine):
    """Worker threads in this process (``threads``; default: one per core, at most four, for a fit)."""

    name = "serial"
    checkpoints = True
    stops_between_blocks = True

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads

    def fit(self, plan: FitPlan, *, watch: Watch = Watch(), checkpoint: Checkpoint | None = None) -> FitResult:
        from .fit import run_plan

        return run_plan(plan, watch, checkpoint, self.threads).result()

    def apply(
        self,
        model: WhiteningModel,
        input_spec: str | Source,
        output_spec: str,
        options: ApplyOptions,
        read: ReadOptions,
        *,
        part: ApplyPart | None = None,
        watch: Watch = Watch(),
    ) -> ApplyOutcome:
        from .apply import apply_model

        return apply_model(model, input_spec, output_spec, options, read, part=part, watch=watch, threads=self.threads)


class DaskEngine(Engine):
    """A Dask cluster: ``scheduler`` (an address), a local cluster of ``workers`` processes, or ``client``;
    every worker must see the stores at the same paths, or read them from object storage."""

    name = "dask"
    checkpoints = False
    stops_between_blocks = False
    output_kinds = ("zarr",)

    def __init__(
        self, scheduler: str | None = None, workers: int | None = None, client: Any = None, split_every: int = 8
    ) -> None:
        self.scheduler, self.workers, self.client, self.split_every = scheduler, workers, client, split_every

    def fit(self, plan: FitPlan, *, watch: Watch = Watch(), checkpoint: Checkpoint | None = None) -> FitResult:
        from .distributed import fit_dask

        # a fresh plan (the Dask engine does not resume): its sources, block size and options
        read = replace(plan.read, block_rows=plan.block_rows)
        return fit_dask([c.spec for c in plan.cursors], plan.precision, plan.skip_nonfinite, read=read, cluster=self)

    serial_only = {
        "direct_io": "direct_io is for the serial engine (Dask workers write through zarr)",
        "keep_columns": "keep_columns is for the serial engine (the Dask engine writes Zarr)",
        "compressor": "compressor is for the serial engine (the Dask engine writes uncompressed Zarr)",
        "checksums": "checksums is for the serial engine (the Dask engine's Zarr 3 chunks always carry their crc32c)",
    }

    def apply(
        self,
        model: WhiteningModel,
        input_spec: str | Source,
        output_spec: str,
        options: ApplyOptions,
        read: ReadOptions,
        *,
        part: ApplyPart | None = None,
        watch: Watch = Watch(),
    ) -> ApplyOutcome:
        from .distributed import apply_dask

        self.check_apply(options)
        if part is not None and part.rows is not None:
            raise BadInputError("an apply of part of an input's rows (rows=) is for the serial engine")
        if part is not None and part.attrs:
            raise BadInputError("an apply recording attributes of its caller's (attrs=) is for the serial engine")
        return apply_dask(model, input_spec, output_spec, options, read, cluster=self, watch=watch)


def engine_for(options: EngineOptions | Engine | None = None, client: Any = None) -> Engine:
    """The engine ``options`` name (default: serial); ``client``: a ``distributed.Client`` to run on."""
    if isinstance(options, Engine):
        return options
    options = options or EngineOptions()
    if options.name == "dask" or client is not None:
        return DaskEngine(options.scheduler, options.workers, client, options.split_every)
    return SerialEngine(options.threads)


__all__ = ["DaskEngine", "Engine", "SerialEngine", "engine_for"]

"""The interface every backend implements: a `Source` of rows and a `Sink` for outputs.

A source is a read-only 2-D array: shape, dtype, natural blocks, rows read into a caller's buffer, what a
fingerprint records, attributes. A sink writes a new 2-D array under a hidden temporary name, renamed into
place only when complete, so nothing unfinished looks finished and nothing existing is touched before.
What a backend can do is said by capability attributes, asked instead of kind names. The interface only:
what the backends share beneath it is in ``streamwhiten.io._store``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ... import params
from ...errors import BadInputError, InterruptedRunError
from ...options import ReadOptions
from ...output_plan import OutputPlan
from ...records import ResumeRecord

if TYPE_CHECKING:  # names for annotations only: the interface does not load the codecs
    from ..codecs import Decoder, Fetched


class Source(ABC):
    """A read-only 2-D array of rows in a store; iterate it with `blocks` and `read_into`. ``dtype`` is in
    native byte order; ``chunk_rows`` is None for a contiguous layout."""

    #: the store kind, for messages (``registry.Backend.kind``)
    kind: ClassVar[str] = "?"
    #: the store holds other columns of the same rows (a table): ``--keep-columns``, id columns
    tabular: ClassVar[bool] = False
    #: `read_into` takes a float32 ``out`` for a float16 store (widening as it reads)
    widens_float16: ClassVar[bool] = False
    #: why a source whose layout digest changed is refused, for the message
    layout_change: ClassVar[str] = "the store was rewritten"
    #: the store is read over the network (a URL): by more threads, retried, never by the local fast path
    remote: bool = False
    #: how its compressed chunks are decoded in the caller's thread (None: by its library, or not compressed)
    decoder: Decoder | None = None
    #: the row of the store that is this source's row 0 (``io.window``), for messages naming a row
    first_row: int = 0

    def __init__(
        self,
        path: str,
        dataset: str | None,
        shape: tuple[int, ...],
        dtype: Any,
        chunk_rows: int | None,
        read: ReadOptions | None = None,
    ) -> None:
        self.path = path
        self.dataset = dataset
        self.shape = tuple(int(s) for s in shape)
        self.dtype: np.dtype[Any] = np.dtype(dtype).newbyteorder("=")
        self.chunk_rows = chunk_rows
        #: how it was opened (missing chunks, storage options)
        self.read_options = read if read is not None else ReadOptions()

    @property
    def fill_missing_chunks(self) -> bool:
        """Read chunks missing from the store as the array's fill value instead of refusing them."""
        return self.read_options.fill_missing_chunks

    @property
    @abstractmethod
    def label(self) -> str:
        """The store and dataset, for messages (a URL without credentials)."""

    @property
    @abstractmethod
    def location(self) -> tuple[str, str]:
        """``(real path, dataset)``: where the array is, as a fingerprint records it (a URL: its normalised
        form, without credentials)."""

    @property
    @abstractmethod
    def identity(self) -> tuple[tuple[Any, ...], str]:
        """Which array this is, however it was named (a link of a file is that file)."""

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_features(self) -> int:
        return self.shape[1]

    @property
    def read_dtype(self) -> np.dtype[Any]:
        """The dtype a block is best read into: float32 for a float16 store that `widens_float16`, else its own."""
        dtype = np.dtype(self.dtype)
        return np.dtype(np.float32) if self.widens_float16 and dtype == np.float16 else dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new C-contiguous array in the store's dtype."""
        return self.read_into(start, stop, np.empty((max(0, stop - start), self.n_features), dtype=self.dtype))

    @abstractmethod
    def read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` into the preallocated ``out`` (C-contiguous); returns ``out[:stop - start]``
        (``fetched``: what `fetch` returned for the same rows, if it was called ahead)."""

    def fetch(self, start: int, stop: int) -> Fetched | None:
        """The stored (compressed) bytes behind rows ``[start, stop)``, read ahead of `read_into`
        (in another thread, say), or None where the backend has no such split (the default)."""
        return None

    def attrs(self) -> dict[str, Any]:
        """The array's attributes (an output's record of the model that wrote it, for instance)."""
        return {}

    @abstractmethod
    def sample_ranges(self, n_rows: int) -> list[tuple[int, int]]:
        """Row ranges of the first ``n_rows`` whose contents a fingerprint hashes."""

    def layout_digest(self, n_rows: int) -> str | None:
        """A digest of how the first ``n_rows`` rows are stored (a Parquet footer, Lance fragments), or None."""
        return None

    def fingerprint_extra(self) -> dict[str, Any]:
        """More fields a fingerprint records, not compared by an update (``size``, ``etag``, ``version``)."""
        return {}

    def column_schema(self, names: list[str]) -> Any:
        """The types of the columns ``names`` (to carry them into an output), checking they exist."""
        raise BadInputError(
            f"{self.label}: keep_columns needs a Parquet or Lance input (a table with other "
            f"columns); this is a {self.kind} store",
            param="keep_columns",
        )

    def read_columns(self, start: int, stop: int, names: list[str]) -> Any:
        """Rows ``[start, stop)`` of the columns ``names``, as a table of the backend's library."""
        self.column_schema(names)
        raise NotImplementedError

    @abstractmethod
    def default_block_rows(self, target_bytes: int = ...) -> int:
        """Rows per block: a whole number of store chunks, about ``target_bytes`` in all."""

    def blocks(
        self, block_rows: int | None = None, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` row ranges covering ``[start, stop)``, aligned to multiples of ``block_rows``."""
        block_rows = int(self.default_block_rows() if block_rows is None else params.check("chunk_rows", block_rows))
        stop = self.n_rows if stop is None else stop
        while start < stop:
            end = min(stop, (start // block_rows + 1) * block_rows)
            yield start, end
            start = end

    def n_blocks(self, block_rows: int) -> int:
        """How many ranges `blocks` yields for all the rows in blocks of ``block_rows``."""
        return sum(1 for _ in self.blocks(block_rows))

    def close(self) -> None:  # noqa: B027 - closing is optional: many stores hold nothing open
        """Release what the source holds open."""

    def __enter__(self) -> Source:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class SinkPlace:
    """Where a sink writes: ``path`` (or URL), ``dataset`` (None: the backend's default), the temporary name
    ``partial`` until committed, and ``read``, how its URLs are reached."""

    path: str
    dataset: str | None
    partial: str
    read: ReadOptions


class Sink(ABC):
    """A new 2-D array being written under the temporary name ``partial``; `commit` renames it to ``path``
    once complete. Made by ``io.open_output``; the class attributes say what the backend can do."""

    #: the store kind, for messages (``registry.Backend.kind``)
    kind: ClassVar[str] = "?"
    #: carries other columns beside the vectors (``--keep-columns``); blocks are row groups of any size
    tabular: ClassVar[bool] = False
    #: compresses its chunks (``--compressor``)
    compressible: ClassVar[bool] = False
    #: whole-chunk row ranges may be written by several processes at once (`region_writer`)
    parallel_writes: ClassVar[bool] = False
    #: the format versions a caller may choose among (``zarr_format``); empty where there is no choice
    format_versions: ClassVar[tuple[int, ...]] = ()
    #: its array always lives under a name inside the store (an HDF5 dataset): specs of it name one
    named: ClassVar[bool] = False
    #: written where it stays (object storage), ``complete = false`` and taken for absent until committed
    in_place: ClassVar[bool] = False

    path: str
    dataset: str | None
    #: the hidden temporary name it is written under until `commit`
    partial: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunk_rows: int
    #: whole chunks are written around the page cache (see ``direct``)
    direct_io: bool
    #: how the URLs of this output are reached (set by ``io.open_output``)
    read_options: ReadOptions
    #: refuses to replace what is at `path` (set by ``io.open_output``: ``Output.check_replaceable``)
    replace_check: Callable[[bool], None] | None

    @classmethod
    @abstractmethod
    def create(cls, place: SinkPlace, plan: OutputPlan) -> Sink:
        """A new output under ``place.partial``, laid out as ``plan`` says, its attributes set from the start."""

    @classmethod
    @abstractmethod
    def resume(cls, place: SinkPlace, plan: OutputPlan, rows_done: int) -> Sink:
        """The partial output of an interrupted run of the same ``plan``, ``rows_done`` rows of it durable."""

    @classmethod
    def incomplete(cls, path: str, read: ReadOptions) -> bool:
        """Whether an output written in place (`in_place`) at ``path`` is one of ours not yet complete."""
        return False

    @property
    @abstractmethod
    def remote(self) -> bool:
        """Whether it is written to object storage (or another URL)."""

    @property
    @abstractmethod
    def label(self) -> str:
        """The output and dataset, for messages (a URL without credentials)."""

    @property
    @abstractmethod
    def progress_path(self) -> str:
        """Sidecar JSON beside the partial output: how many rows are safely written, and for which job."""

    @abstractmethod
    def write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        """Write ``block`` at row ``start``; ``columns`` (tabular sinks only) are other columns of the same
        rows, carried from the input."""

    @abstractmethod
    def save_progress(self, record: ResumeRecord) -> None:
        """Make rows ``[0, record.rows_done)`` durable, then write ``record`` atomically (for a later resume)."""

    def region_writer(self) -> Callable[[int, np.ndarray], None]:
        """A picklable writer of whole-chunk row ranges, for worker processes (`parallel_writes`)."""
        raise BadInputError(f"{self.path}: only a Zarr output can be written by several processes at once")

    @abstractmethod
    def commit(self, overwrite: bool = False, attrs: Mapping[str, Any] | None = None) -> None:
        """Set ``attrs`` and ``complete = True``, make everything durable, and rename into place
        (replacing an old output only if ``overwrite`` and it is an output of ours: ``Output.check_replaceable``)."""

    @abstractmethod
    def abort(self) -> None:
        """Remove the temporary output; the target path is left as it was."""

    @abstractmethod
    def suspend(self) -> None:
        """Close, keeping the partial output and its progress record for a later resume."""

    def __enter__(self) -> Sink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            return
        if issubclass(exc_type, (KeyboardInterrupt, InterruptedRunError)):
            self.suspend()
        else:
            self.abort()

"""Every ```python block of README.md and docs/*.md (the pages of the docs site) runs as written.

Each block runs in-process (``exec``) in a fresh temporary working directory that its doc file's fixture
fills with the small files the block names (stores, a fitted ``model.npz``, exports, a published job...),
made with the package itself. The blocks of one doc file build on each other as a reader would run
them: they run in order in one namespace (``np`` or ``SentenceTransformer`` imported by an earlier block
is there for a later one; running one block alone runs the earlier ones of its file first). The arrays
the prose supplies and a block does not define (``query``, ``rows``, ``X, y``, ``raw_corpus``...) are
given to it, made for that block, so a name from an earlier block never stands in for one.

Placeholders of a user's site are pointed at local stand-ins, each listed in ``SITE``: the S3-compatible
server ``http://minio:9000`` at the moto server of ``tests/conftest.py`` (bucket ``emb`` holds what the
block reads), the Dask scheduler ``tcp://head:8786`` at a ``LocalCluster``, the shared disk ``/shared/``
at a folder of the working directory. Nothing else in a block is changed.

A block that cannot run here is preceded in its markdown by ``<!-- not run: REASON -->``; it is skipped
with that reason. A failure means the doc no longer matches the code: fix the doc (or the code), not this
test.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->$")
D, K = 384, 256  # the docs' widths: all-MiniLM-L6-v2's 384, whitened to 256


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository
    line: int  # of the opening fence
    code: str
    not_run: str | None  # the reason given by a marker comment right before the block


def doc_blocks(path: Path) -> list[Block]:
    """The ```python blocks of one markdown file, with the ``not run`` marker before each, if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
            marker = NOT_RUN.match(before)
            rel = str(path.relative_to(REPO))
            found.append(Block(rel, start + 1, "\n".join(body) + "\n", marker.group(1) if marker else None))
        i += 1
    return found


BLOCKS = [block for path in DOCS for block in doc_blocks(path)]


def free_names(code: str) -> set[str]:
    """Names a block reads but neither assigns nor imports (nor are builtins)."""
    tree = ast.parse(code)
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return loaded - bound - set(dir(builtins))


EXTRAS = {  # optional packages a block may import -> what installs them
    "dask": "'streamwhiten[dask]'",
    "faiss": "'streamwhiten[faiss]'",
    "lance": "'streamwhiten[lance]'",
    "pyarrow": "'streamwhiten[parquet]'",
    "onnxruntime": "'streamwhiten[onnx]'",
    "safetensors": "'streamwhiten[torch]'",
    "sentence_transformers": "'streamwhiten[sentence-transformers]'",
    "matplotlib": "'streamwhiten[report]'",
    "pandas": "pandas",
    "sklearn": "scikit-learn",
    "torch": "'streamwhiten[torch]'",
}

USES = {  # used by a block without an import (an earlier block of its file imported it)
    'transform="pandas"': "pandas",
    "write_report(": "matplotlib",
    "SentenceTransformer(": "sentence_transformers",
}


def needs(block) -> set[str]:
    """The optional packages a block uses."""
    return (imported(block.code) | {module for text, module in USES.items() if text in block.code}) & set(EXTRAS)


def missing(block) -> str | None:
    """The first optional package the block uses that is not installed, if any."""
    import importlib.util

    return next((module for module in sorted(needs(block)) if importlib.util.find_spec(module) is None), None)


def imported(code: str) -> set[str]:
    """The top-level packages a block imports."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


# ----------------------------------------------------------------------------- data the blocks read


def rows(n: int, seed: int, d: int = D) -> np.ndarray:
    """Anisotropic float32 rows with an offset, as sentence embeddings are."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((d, d)) / (1.0 + np.arange(d))[:, None] ** 0.7
    return (0.5 + rng.standard_normal((n, d)) @ mixing).astype(np.float32)


def h5(path, data, dataset="emb") -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        handle.create_dataset(dataset, data=data, chunks=(min(256, len(data)), data.shape[1]))


def zarr_store(path, data) -> None:
    import zarr

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    array = zarr.create_array(store=str(path), shape=data.shape, chunks=(256, data.shape[1]), dtype=data.dtype)
    array[...] = data


def fitted(path, source, **setting) -> None:
    import streamwhiten

    streamwhiten.fit(source, str(path), setting=streamwhiten.Setting(**setting) if setting else None)


def retrieval_task(workdir: Path, queries: str, corpus: str) -> None:
    """Queries near some corpus rows, those rows relevant (qrels.tsv), a few other pairs excluded."""
    rng = np.random.default_rng(3)
    corpus_rows = rows(600, seed=4)
    picks = rng.choice(len(corpus_rows), 30, replace=False)
    h5(workdir / queries, corpus_rows[picks] + 0.3 * rng.standard_normal((30, D)).astype(np.float32), "mean")
    h5(workdir / corpus, corpus_rows, "mean")
    (workdir / "qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, c in enumerate(picks))
    )
    (workdir / "exclude.tsv").write_text(
        "query-id\tcorpus-id\n" + "".join(f"{q}\t{(c + 1) % 600}\n" for q, c in enumerate(picks))
    )


def upload(local: Path, url: str) -> None:
    from conftest import s3fs_client

    fs = s3fs_client(os.environ["AWS_ENDPOINT_URL"])
    bucket = url[len("s3://") :].split("/")[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    fs.put(str(local), url, recursive=True)


def tuned_model(path, source) -> None:
    """A model that records int8 storage, as ``tune`` writes it (k = 256)."""
    import streamwhiten
    from streamwhiten.core.model import save_model
    from streamwhiten.core.quantize import Storage

    model = streamwhiten.fit(source, None, setting=streamwhiten.Setting(n_components=K)).model
    save_model(dataclasses.replace(model, storage=Storage(dtype="int8")), str(path))


def st_base(directory: Path) -> None:
    """A local sentence-transformers model of width 384 ending in Normalize (as all-MiniLM-L6-v2 does)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "how", "do", "i", "whiten", "embeddings", "?"]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    embedding = StaticEmbedding(tokenizer, embedding_weights=rows(len(words), seed=9))
    SentenceTransformer(modules=[embedding, Normalize()], device="cpu").save(str(directory))


# ----------------------------------------------------------------------------- one preparer per doc file
# Each gets the working directory, the block and the session's stand-ins, writes the files the block
# names, and returns the values the prose supplies that the block reads without defining.


def prepare_readme(workdir: Path, block: Block, site: dict) -> dict:
    import streamwhiten

    code = block.code
    corpus = rows(2000, seed=1)
    h5(workdir / "corpus.h5", corpus, "embeddings")
    zarr_store(workdir / "corpus.zarr", corpus)
    for day in (1, 2):
        h5(workdir / "shards" / f"day-{day}.h5", rows(700, seed=10 + day))
    (workdir / "white").mkdir()  # an output folder of the user's
    if "s3://" in code:
        upload(workdir / "corpus.zarr", "s3://emb/corpus.zarr")
    writes_model = 'save("model.npz")' in code or '"model.npz",\n' in code
    if ("model.npz" in code or "codes.h5" in code or "whiten.npz" in code) and not writes_model:
        fitted(workdir / "model.npz", "corpus.h5:/embeddings")
    if "q.h5" in code:
        retrieval_task(workdir, "q.h5", "c.h5")
    if "codes.h5" in code:
        streamwhiten.apply(
            "model.npz", "corpus.h5:/embeddings", "codes.h5", options=streamwhiten.ApplyOptions(dtype="int8")
        )
    if "whiten.npz" in code:  # export model.npz -o whiten.npz -k 256 --normalize
        from streamwhiten import export

        export.export(streamwhiten.load_model("model.npz").as_affine(n_components=K, normalize=True), "whiten.npz")
    if "published(" in code:  # the README's nightly job, run once over the shards above
        from streamwhiten.cli import main

        (workdir / "models").mkdir()
        (workdir / "out").mkdir()
        (workdir / "job.toml").write_text(
            'name = "nightly"\n[input]\npaths = ["shards/day-*.h5"]\n[model]\npath = "models/m.npz"\n'
            '[apply]\noutput = "out/{stem}.h5"\n[publish]\n'
        )
        assert main(["run", "job.toml", "-q"]) == 0
    X = rows(150, seed=6, d=K)  # labelled rows for a classifier: the narrowest width the grid's k allow
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    return dict(rows=rows(8, seed=2), more_rows=rows(300, seed=3), query=rows(1, seed=5)[0], X=X, y=y)


def prepare_dask(workdir: Path, block: Block, site: dict) -> dict:
    shared = workdir / "shared"
    zarr_store(shared / "corpus" / "all.zarr", rows(1500, seed=1))
    h5(shared / "a.h5", rows(800, seed=2))
    zarr_store(shared / "b.zarr", rows(900, seed=3))
    (shared / "out").mkdir()
    return {}


def prepare_evaluation(workdir: Path, block: Block, site: dict) -> dict:
    if "queries.h5" in block.code:
        retrieval_task(workdir, "queries.h5", "corpus.h5")
        fitted(workdir / "model.npz", "corpus.h5:/mean")
    if "dev.h5" in block.code:
        rng = np.random.default_rng(7)
        a = rows(400, seed=7)
        b = a + rng.standard_normal(a.shape).astype(np.float32) * rng.uniform(0.1, 3, (400, 1)).astype(np.float32)
        score = -np.linalg.norm(a - b, axis=1)
        with h5py.File(workdir / "dev.h5", "w") as handle:
            handle["a"], handle["b"], handle["score"] = a, b, score
        fitted(workdir / "model.npz", [f"dev.h5:/{name}" for name in ("a", "b")])
    return {}


def prepare_nightly(workdir: Path, block: Block, site: dict) -> dict:
    from streamwhiten.cli import main

    if "published(" in block.code:
        for day in (1, 2):
            h5(workdir / "shards" / f"day-{day}.h5", rows(600, seed=20 + day))
        (workdir / "models").mkdir()
        (workdir / "out").mkdir()
        (workdir / "job.toml").write_text(
            'name = "nightly"\n[input]\npaths = ["shards/day-*.h5"]\n[model]\npath = "models/m.npz"\n'
            '[apply]\noutput = "out/{stem}.h5"\n[publish]\n'
        )
        assert main(["run", "job.toml", "-q"]) == 0
    if '"model.npz"' in block.code:
        h5(workdir / "corpus.h5", rows(1500, seed=1))
        fitted(workdir / "model.npz", "corpus.h5")
    return dict(new_rows=rows(300, seed=30))


def prepare_serving(workdir: Path, block: Block, site: dict) -> dict:
    import streamwhiten
    from streamwhiten import export

    code = block.code
    corpus = rows(1200, seed=1)
    h5(workdir / "corpus.h5", corpus)
    fitted(workdir / "model.npz", "corpus.h5", n_components=K)
    model = streamwhiten.load_model("model.npz")
    if "whiten.npz" in code:
        export.export(model.as_affine(normalize=True), "whiten.npz")
    if "tuned.npz" in code:
        tuned_model(workdir / "tuned.npz", "corpus.h5")
    if "index.faiss" in code:
        if "tuned.npz" in code:  # the int8 storage's index
            export.export(streamwhiten.load_model("tuned.npz"), "index.faiss")
        else:
            export.export(model.as_affine(normalize=True), "index.faiss", index="HNSW32")
    if "bits.binary.faiss" in code:
        export.export(streamwhiten.load_model("tuned.npz").as_affine(dtype="binary"), "bits.binary.faiss")
    if "whiten.faiss" in code:
        export.export(model, "whiten.faiss")
    if "whiten.onnx" in code:
        export.export(model.as_affine(normalize=True), "whiten.onnx")
    if "whiten.safetensors" in code:
        export.export(model, "whiten.safetensors")
    if "SentenceTransformer(" in code:
        st_base(workdir / "all-MiniLM-L6-v2")
        white = model.as_affine(normalize=True)
        if "-white" in code:
            export.export(white, "all-MiniLM-L6-v2-white", append_to="all-MiniLM-L6-v2")
        if "whiten-st" in code:
            export.export(white, "whiten-st", fmt="sentence-transformers")
    given = dict(
        query=rows(1, seed=2)[0],
        query_batch=rows(5, seed=3),
        queries=rows(5, seed=4),
        raw_corpus=rows(300, seed=5),
        raw_queries=rows(5, seed=6),
        x=rows(5, seed=7),
    )
    if "torch" in code:
        import torch

        given["x"] = torch.from_numpy(given["x"])
    if "corpus_index" in code:
        import faiss

        corpus_index = faiss.IndexFlatIP(K)
        corpus_index.add(np.ascontiguousarray(model.as_affine(normalize=True).transform(corpus), dtype=np.float32))
        given["corpus_index"] = corpus_index
    return given


PREPARE = {
    "README.md": prepare_readme,
    "docs/python.md": prepare_readme,  # the README's Python sections moved there, with its files
    "docs/search.md": prepare_readme,
    "docs/dask.md": prepare_dask,
    "docs/evaluation.md": prepare_evaluation,
    "docs/nightly.md": prepare_nightly,
    "docs/serving.md": prepare_serving,
}


# ----------------------------------------------------------------------------- the site's stand-ins


@pytest.fixture(scope="module")
def site(request):
    """The local stand-ins of a user's site: what each placeholder in a block becomes (started on demand)."""
    stand_ins: dict = {}

    def get(placeholder: str) -> str:
        if placeholder not in stand_ins:
            if placeholder == "http://minio:9000":
                stand_ins[placeholder] = request.getfixturevalue("s3_server")
            elif placeholder == "tcp://head:8786":
                pytest.importorskip("distributed", reason="docs/dask.md needs dask[distributed]")
                from distributed import LocalCluster

                cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)
                request.addfinalizer(cluster.close)
                stand_ins[placeholder] = cluster.scheduler_address
        return stand_ins[placeholder]

    return get


SITE = {  # placeholder in the docs -> how the test gets its local stand-in
    "http://minio:9000": lambda site, workdir: site("http://minio:9000"),
    "tcp://head:8786": lambda site, workdir: site("tcp://head:8786"),
    '"/shared/': lambda site, workdir: f'"{workdir}/shared/',
}


# ----------------------------------------------------------------------------- running the blocks

_STATE: dict[str, dict] = {}  # doc -> {"namespace": ..., "ran": set of lines, "failed": line or None}


def run_block(block: Block, root: Path, site, monkeypatch) -> None:
    workdir = root / f"{Path(block.doc).stem}-{block.line}"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = block.code
    for placeholder, stand_in in SITE.items():
        if placeholder in code:
            code = code.replace(placeholder, stand_in(site, workdir))
    from streamwhiten.io import remote

    remote.clear_cache()
    given = PREPARE[block.doc](workdir, block, site)
    state = _STATE[block.doc]
    namespace = state["namespace"]
    namespace.update({name: value for name, value in given.items() if name in free_names(block.code)})
    # One BLAS thread: many small eigendecompositions (the README's GridSearchCV) run several times faster so
    # on a busy 2-core machine; the library sets its own per-worker limits inside it as usual.
    with threadpool_limits(1):
        exec(compile(code, f"{block.doc}:{block.line}", "exec"), namespace)


TORCH = {"torch", "sentence_transformers"}  # a block using these carries the `torch` marker


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=f"{b.doc}:{b.line}", marks=[pytest.mark.torch] if needs(b) & TORCH else []) for b in BLOCKS],
)
def test_doc_example_runs(block, tmp_path, site, monkeypatch):
    """The block runs without an error, after the earlier blocks of its doc file (in their own directories)."""
    if block.not_run:
        pytest.skip(f"{block.doc}:{block.line}: not run: {block.not_run}")
    for module in sorted(needs(block)):
        pytest.importorskip(module, reason=f"{block.doc}:{block.line} needs {module}: pip install {EXTRAS[module]}")
    state = _STATE.setdefault(block.doc, {"namespace": {"__name__": "__doc_example__"}, "ran": set()})
    for earlier in (b for b in BLOCKS if b.doc == block.doc and b.line < block.line and not b.not_run):
        if earlier.line not in state["ran"] and missing(earlier) is None:  # one that would skip is left out
            try:
                run_block(earlier, tmp_path, site, monkeypatch)
            except Exception as exc:
                pytest.fail(f"an earlier block of the same file, {earlier.doc}:{earlier.line}, failed: {exc!r}")
            state["ran"].add(earlier.line)
    state["ran"].add(block.line)
    run_block(block, tmp_path, site, monkeypatch)


def test_blocks_found():
    """The extraction finds the blocks the docs hold (a change of fence style would silently drop them)."""
    counts = {doc: sum(b.doc == doc for b in BLOCKS) for doc in PREPARE}
    assert all(counts.values()), counts
    assert sum(counts.values()) == len(BLOCKS) >= 20
    assert not [b for b in BLOCKS if b.doc not in PREPARE], "a doc file with python blocks has no preparer"


def test_not_run_markers_only_before_python_blocks():
    """A ``not run`` marker is honoured only right before a block: one anywhere else is a mistake."""
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if NOT_RUN.match(line.strip()):
                after = next((x.strip() for x in lines[i + 1 :] if x.strip()), "")
                assert after == "```python", f"{path.relative_to(REPO)}:{i + 1}: marker not followed by a python block"


PUBLIC_MODULES = {"streamwhiten", "streamwhiten.export", "streamwhiten.serving", "streamwhiten.synthetic"}
# Private imports the docs still need, each to go when the public API covers it (a stale entry fails).
KNOWN_PRIVATE = {  # (doc, module) -> why
    ("docs/evaluation.md", "streamwhiten.evaluation.evaluate"): "open_pairs, evaluate_pairs are not public",
    ("docs/evaluation.md", "streamwhiten.core.model"): "save_model is not public",
    ("docs/evaluation.md", "streamwhiten.evaluation.tune"): "grid_search, tune are not public",
    ("docs/evaluation.md", "streamwhiten.evaluation.report"): "collect, write_report are not public",
    ("docs/evaluation.md", "streamwhiten.evaluation.sweep"): "SweepGrid, sweep, tune_retrieval are not public",
}


def test_blocks_import_only_the_public_api():
    """The docs import only ``streamwhiten.__all__`` (and its public modules), as the README says."""
    import streamwhiten

    private, seen = [], set()
    for block in BLOCKS:
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "streamwhiten":
                modules = [node.module]
                if node.module == "streamwhiten":
                    modules += [f"streamwhiten.{a.name}" for a in node.names if a.name not in streamwhiten.__all__]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.split(".")[0] == "streamwhiten"]
            else:
                continue
            for module in modules:
                if (block.doc, module) in KNOWN_PRIVATE:
                    seen.add((block.doc, module))
                elif module not in PUBLIC_MODULES:
                    private.append(f"{block.doc}:{block.line}: {module}")
    assert not private, f"docs import private names: {private}"
    assert seen == set(KNOWN_PRIVATE), f"stale KNOWN_PRIVATE entries: {set(KNOWN_PRIVATE) - seen}"

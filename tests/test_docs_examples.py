"""Every code block of README.md and docs/*.md (the pages of the docs site) runs as written.

**Python blocks** run in-process (``exec``) in a fresh temporary working directory that its doc file's fixture
fills with the small files the block names (stores, a fitted ``model.npz``, exports, a published job...),
made with the package itself. The blocks of one doc file build on each other as a reader would run
them: they run in order in one namespace (``np`` or ``SentenceTransformer`` imported by an earlier block
is there for a later one; running one block alone runs the earlier ones of its file first). The arrays
the prose supplies and a block does not define (``query``, ``rows``, ``X, y``, ``raw_corpus``...) are
given to it, made for that block, so a name from an earlier block never stands in for one.

**Shell blocks** (fenced ``bash``/``sh``/``shell``/``console``, or indented or bare-fenced blocks that
start with a command; a console block's ``$`` lines without their output) are checked in the quick tier
against the CLI, in-process: every ``streamwhiten`` command and option must exist, with the arguments
it needs. The slow tier runs them: the blocks of one page in order, by bash (stopping at the first
command that fails), in one temporary folder that the page's ``SHELL_PREPARE`` fills with small inputs
under the names the page uses, with the page's own ``# job.toml`` blocks written there and
``streamwhiten`` this worktree's. Where the prose says the inputs change between two blocks ("later,
when new shards arrived"), ``SHELL_BEFORE`` changes them.

Placeholders of a user's site are pointed at local stand-ins, each listed in ``SITE`` (``SHELL_SITE``):
the S3-compatible server ``http://minio:9000`` at the moto server of ``tests/conftest.py`` (bucket ``emb``
holds what the block reads; a shell block's ``s3://`` URLs reach it through the environment that fixture
sets), the Dask scheduler ``tcp://head:8786`` at a ``LocalCluster``, the shared disk ``/shared/`` at a
folder of the working directory. Nothing else in a block is changed.

A block that cannot run here is preceded in its markdown by ``<!-- not run: REASON -->``; it is skipped
with that reason (``test_shell_blocks_found`` lists the shell ones). A failure means the doc no longer
matches the code: fix the doc (or the code), not this test.

Also here: the docstrings the API page renders hold no Sphinx roles and link only what it renders,
``mkdocs.yml`` says where the site is served, and getting-started's table of the tests that need the
STS-B data is the tests' code.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib.util
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
    line: int  # of the opening fence (or the first line of an indented block)
    code: str  # python: the block; shell: the script a reader types (a console block's commands, no output)
    not_run: str | None  # the reason given by a marker comment right before the block
    lang: str = "python"  # or "shell"


FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
SHELL_FENCES = {"bash", "sh", "shell", "console"}
#: The programs a block of shell commands starts with; an unfenced or bare-fenced block starting with
#: anything else (a diagram, a formula, an error message, a command's output) holds no commands.
PROGRAMS = {"streamwhiten", "pip", "python", "python3", "mkdir", "dask", "cd", "ls", "cat", "export"}


def code_blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """Every code block of one markdown file as ``(line, language, text, not-run reason)``: fenced blocks
    (language as written, "" for none) and indented ones (language "indented"), their text dedented."""
    import textwrap

    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        indented = lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip())
        if not fence and not indented:
            i += 1
            continue
        start, body = i, []
        if fence:
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            i += 1
        else:
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i])
                i += 1
        before = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        marker = NOT_RUN.match(before)
        text = textwrap.dedent("\n".join(body).rstrip("\n")) + "\n"
        found.append((start + 1, fence.group(2) if fence else "indented", text, marker.group(1) if marker else None))
    return found


def shell_script(text: str, lang: str) -> str | None:
    """The commands of a block, as a shell runs them, or None if it holds none. A console block (lines
    typed after ``$ ``, continued by a trailing backslash) gives its commands without their output."""
    lines = text.splitlines()
    first = next((line for line in lines if line.strip() and not line.startswith("#")), "")
    if first.startswith("$ "):
        commands, continued = [], False
        for line in lines:
            if line.startswith("$ ") or continued:
                commands.append(line[2:] if line.startswith("$ ") else line)
                continued = line.rstrip().endswith("\\")
        return "\n".join(commands) + "\n"
    program = first.split(" ")[0]
    if lang in SHELL_FENCES or (lang in ("", "indented") and (program in PROGRAMS or re.match(r"^\w+=", program))):
        return text
    return None


def doc_blocks(path: Path) -> list[Block]:
    """The ```python blocks of one markdown file, with the ``not run`` marker before each, if any."""
    rel = str(path.relative_to(REPO))
    return [Block(rel, line, text, reason) for line, lang, text, reason in code_blocks(path) if lang == "python"]


def shell_blocks(path: Path) -> list[Block]:
    """The blocks of shell commands of one markdown file (fenced bash/sh/shell/console, or indented or
    bare-fenced commands), with the ``not run`` marker before each, if any."""
    rel = str(path.relative_to(REPO))
    found = []
    for line, lang, text, reason in code_blocks(path):
        script = shell_script(text, lang) if lang != "python" else None
        if script is not None:
            found.append(Block(rel, line, script, reason, "shell"))
    return found


BLOCKS = [block for path in DOCS for block in doc_blocks(path)]
SHELL_BLOCKS = [block for path in DOCS for block in shell_blocks(path)]


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


def retrieval_task(workdir: Path, queries: str, corpus: str, d: int = D) -> None:
    """Queries near some corpus rows, those rows relevant (qrels.tsv), a few other pairs excluded."""
    rng = np.random.default_rng(3)
    corpus_rows = rows(600, seed=4, d=d)
    picks = rng.choice(len(corpus_rows), 30, replace=False)
    h5(workdir / queries, corpus_rows[picks] + 0.3 * rng.standard_normal((30, d)).astype(np.float32), "mean")
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
    from streamwhiten.storage import Storage

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
            elif placeholder.startswith("tcp://head:8786"):
                pytest.importorskip("distributed", reason="docs/dask.md needs dask[distributed]")
                from distributed import LocalCluster

                tcp = {"protocol": "tcp://", "host": "127.0.0.1"} if placeholder.endswith("(tcp)") else {}
                cluster = LocalCluster(
                    n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None, **tcp
                )
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


def test_not_run_markers_only_before_code_blocks():
    """A ``not run`` marker is honoured only right before a python or shell block: one anywhere else (or
    before a block that is neither) is a mistake."""
    marked = {(block.doc, block.line) for block in BLOCKS + SHELL_BLOCKS if block.not_run}
    for path in DOCS:
        rel = str(path.relative_to(REPO))
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if NOT_RUN.match(line.strip()):
                after = next(j for j in range(i + 1, len(lines)) if lines[j].strip())
                assert (rel, after + 1) in marked, f"{rel}:{i + 1}: marker not followed by a python or shell block"


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


# ----------------------------------------------------------------------------- the shell blocks
# Every block of shell commands (README.md and docs/*.md) is parsed here (quick: each `streamwhiten` command
# must name a command and options the CLI has, each script and extra it names must exist) and, in the slow
# tier, run as written: the blocks of one page in order, in one temporary folder that the page's preparer
# fills with small inputs under the names the page uses, by bash, with `streamwhiten` the worktree's.


def commands(script: str) -> list[list[str]]:
    """The simple commands of a script, each as its words (comments dropped, continuations joined, split
    at ``&&``, ``||``, ``;`` and ``|``; a variable set by a line of its own, ``task="..."``, expanded)."""
    import shlex

    found, variables = [], {}
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word.startswith("$") and word.strip("${}") in variables:  # set by an earlier line of the block
                words += variables[word.strip("${}")]
                continue
            if word in (";", "&&", "||", "|", "&"):
                assigned = re.match(r"^(\w+)=(.*)$", words[0], re.S) if len(words) == 1 else None
                if assigned:
                    variables[assigned.group(1)] = shlex.split(assigned.group(2))
                elif words:
                    found.append(words)
                words = []
            else:
                words.append(word)
    return found


def cli_problems(words: list[str]) -> list[str]:
    """What is wrong with one ``streamwhiten ...`` command line for the CLI: an unknown command or option,
    an option without its value, an extra argument, a required argument missing (values are not checked:
    the files they name exist only when the block runs)."""
    import click

    from streamwhiten.cli.app import cli

    with cli.make_context("streamwhiten", [], resilient_parsing=True) as group:
        if len(words) < 2 or words[1].startswith("-"):
            return [] if words[1:] in ([], ["--help"], ["-h"], ["--version"]) else [f"group options {words[1:]}"]
        command = cli.get_command(group, words[1])
        if command is None:
            return [f"no command {words[1]!r}"]
        try:  # click's own parser: options and their values, no callbacks, no value checks
            with click.Context(command, info_name=words[1], parent=group) as ctx:
                values, args, _ = command.make_parser(ctx).parse_args(args=words[2:])
        except click.UsageError as exc:
            return [exc.format_message()]
    if {"-h", "--help"} & set(words):
        return []
    problems = [f"unexpected argument {arg!r}" for arg in args]  # the parser keeps what no parameter took
    given = {name for name, value in values.items() if value is not None and "UNSET" not in repr(value)}
    missing = [p for p in command.params if p.required and p.name not in given]
    return problems + [f"missing {p.name if isinstance(p, click.Argument) else '/'.join(p.opts)}" for p in missing]


def extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def shell_problems(block: Block) -> list[str]:
    """What the quick check finds wrong with a block's commands, each naming the command."""
    problems = []
    for words in commands(block.code):
        if words[0] == "streamwhiten":
            problems += [f"{' '.join(words)}: {p}" for p in cli_problems(words)]
        elif words[0] in ("python", "python3") and words[1:2] and words[1].endswith(".py"):
            if not (REPO / words[1]).is_file():
                problems.append(f"{' '.join(words)}: no script {words[1]}")
        elif words[:2] == ["pip", "install"]:
            for word in words[2:]:
                named = re.match(r"^(?:streamwhiten|\.)\[([^\]]+)\]$", word)
                unknown = set(named.group(1).split(",")) - extras() if named else set()
                problems += [f"{' '.join(words)}: no extra {name!r} in pyproject.toml" for name in sorted(unknown)]
        elif words[0] not in PROGRAMS and words[0] not in (".", "source"):
            problems.append(f"{' '.join(words)}: {words[0]!r} is no program a docs block may run")
    return problems


def test_shell_blocks_found():
    """The extraction finds the shell blocks the pages hold, every page with one has a preparer, and each
    block not run says why (the list is printed: ``pytest -rP``)."""
    pages = {block.doc for block in SHELL_BLOCKS}
    assert len(SHELL_BLOCKS) >= 20 and {"README.md", "docs/search.md", "docs/getting-started.md"} <= pages
    assert pages <= set(SHELL_PREPARE), f"pages with shell blocks but no preparer: {pages - set(SHELL_PREPARE)}"
    not_run = [f"{b.doc}:{b.line}: {b.not_run}" for b in SHELL_BLOCKS if b.not_run]
    assert all(len(b.not_run.split()) >= 5 for b in SHELL_BLOCKS if b.not_run), "a not-run marker must say why"
    print(f"{len(SHELL_BLOCKS)} shell blocks, {len(SHELL_BLOCKS) - len(not_run)} run, {len(not_run)} not run:")
    print("\n".join(not_run))


@pytest.mark.parametrize("block", [pytest.param(b, id=f"{b.doc}:{b.line}") for b in SHELL_BLOCKS])
def test_shell_block_commands_exist(block):
    """Each block's commands are ones the CLI has, with options it takes (in-process, no command runs):
    a renamed or removed option fails here, in the quick tier, before the slow tier runs the pages."""
    assert shell_problems(block) == []


def test_the_shell_check_catches_a_wrong_option_and_command():
    """The quick check is no formality: it refuses what the CLI would."""
    block = Block("x.md", 1, "streamwhiten fit a.h5 -o m.npz --varaince 0.9\nstreamwhiten fitt a.h5\n", None, "shell")
    problems = shell_problems(block)
    assert len(problems) == 2 and "--varaince" in problems[0] and "fitt" in problems[1]
    assert shell_problems(Block("x.md", 1, "streamwhiten info\nstreamwhiten info a b\n", None, "shell")) == [
        "streamwhiten info: missing model_path",
        "streamwhiten info a b: unexpected argument 'b'",
    ]


def parquet_shards(folder: Path, n_files: int, n_rows: int) -> None:
    """A Hugging Face-style folder of Parquet shards with ``id``, ``url`` and ``embedding`` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        data = rows(n_rows, seed=40 + i)
        ids = pa.array(range(i * n_rows, (i + 1) * n_rows), pa.int64())
        urls = pa.array([f"https://example.org/{j}" for j in range(i * n_rows, (i + 1) * n_rows)])
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), D)
        table = pa.table({"id": ids, "url": urls, "embedding": vectors})
        pq.write_table(table, folder / f"train-{i:05d}-of-{n_files:05d}.parquet", row_group_size=256)


def empty_bucket(site) -> None:
    """The local S3 server started and its bucket ``emb`` empty: each page writes its own outputs there."""
    from conftest import s3fs_client

    fs = s3fs_client(site("http://minio:9000"))
    if fs.exists("emb"):
        fs.rm("emb", recursive=True)
    fs.mkdir("emb")


def shell_readme(workdir: Path, site) -> None:
    for day in (1, 2):
        h5(workdir / "shards" / f"day-{day}.h5", rows(700, seed=10 + day))
    zarr_store(workdir / "corpus.zarr", rows(600, seed=1))
    empty_bucket(site)
    upload(workdir / "corpus.zarr", "s3://emb/corpus.zarr")
    retrieval_task(workdir, "q.h5", "c.h5")


def shell_getting_started(workdir: Path, site) -> None:
    h5(workdir / "corpus.h5", rows(800, seed=1), "embeddings")
    zarr_store(workdir / "corpus.zarr", rows(800, seed=1))
    for day in (1, 2):
        zarr_store(workdir / "shards" / f"day-{day}.zarr", rows(500, seed=10 + day))


def shell_stores(workdir: Path, site) -> None:
    import lance
    import pyarrow as pa

    parquet_shards(workdir / "data", 4, 300)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(rows(600, seed=2).ravel()), D)
    lance.write_dataset(pa.table({"vector": vectors}), str(workdir / "vectors.lance"))
    empty_bucket(site)
    for day in (1, 2):
        zarr_store(workdir / "s3" / "shards" / f"day-{day}.zarr", rows(500, seed=10 + day))
    zarr_store(workdir / "s3" / "corpus.zarr", rows(600, seed=1))
    parquet_shards(workdir / "s3" / "train", 1, 400)
    (workdir / "s3" / "train" / "train-00000-of-00001.parquet").rename(workdir / "s3" / "train.parquet")
    for name in ("shards", "corpus.zarr", "train.parquet"):
        upload(workdir / "s3" / name, f"s3://emb/{name}")


def shell_resume(workdir: Path, site) -> None:
    for day in (1, 2):
        h5(workdir / "shards" / f"day-{day}.h5", rows(700, seed=10 + day))


def shell_nightly(workdir: Path, site) -> None:
    for day in (1, 2):
        h5(workdir / "shards" / f"day-{day}.h5", rows(600, seed=20 + day))


def shell_search(workdir: Path, site) -> None:
    """96 columns, not 384: the page trains faiss's OPQ, whose cost grows with the width, not the rows."""
    h5(workdir / "corpus.h5", rows(1200, seed=1, d=96))
    fitted(workdir / "model.npz", f"{workdir}/corpus.h5:/emb")
    retrieval_task(workdir, "q.h5", "c.h5", d=96)


def pairs(path: Path, seed: int, names=("a", "b", "score")) -> None:
    """Labelled pairs: ``b`` is ``a`` plus noise of a spread per pair, the score minus their distance."""
    rng = np.random.default_rng(seed)
    a = rows(400, seed=seed)
    b = a + rng.standard_normal(a.shape).astype(np.float32) * rng.uniform(0.1, 3, (400, 1)).astype(np.float32)
    with h5py.File(path, "w") as handle:
        handle[names[0]], handle[names[1]], handle[names[2]] = a, b, -np.linalg.norm(a - b, axis=1)


def shell_evaluation(workdir: Path, site) -> None:
    pairs(workdir / "sts.h5", 7, ("mean_a", "mean_b", "score"))
    pairs(workdir / "dev.h5", 8)
    pairs(workdir / "test.h5", 9)
    retrieval_task(workdir, "queries.h5", "corpus.h5")
    with h5py.File(workdir / "corpus.h5", "a") as handle:
        handle["embeddings"] = handle["mean"][...]
    (workdir / "queries.h5").rename(workdir / "test-queries.h5")
    (workdir / "qrels.tsv").rename(workdir / "test-qrels.tsv")
    retrieval_task(workdir, "queries.h5", "corpus-again.h5")


def shell_serving(workdir: Path, site) -> None:
    h5(workdir / "corpus.h5", rows(1200, seed=1), "embeddings")
    if importlib.util.find_spec("sentence_transformers") is not None:
        st_base(workdir / "all-MiniLM-L6-v2")


def shell_dask(workdir: Path, site) -> None:
    for day in (1, 2):
        zarr_store(workdir / "shards" / f"day-{day}.zarr", rows(500, seed=10 + day))
    h5(workdir / "corpus.h5", rows(800, seed=1), "embeddings")
    for i in (1, 2):
        zarr_store(workdir / "shared" / "corpus" / f"shard-{i}.zarr", rows(500, seed=20 + i))
    zarr_store(workdir / "shared" / "corpus" / "all.zarr", rows(1000, seed=3))
    for folder in ("models", "out"):  # the shared disk's folders the page writes into
        (workdir / "shared" / folder).mkdir()
    empty_bucket(site)
    upload(workdir / "shared" / "corpus", "s3://emb/corpus")


SHELL_PREPARE = {  # page -> what writes the inputs its shell blocks name, small, under those names
    "README.md": shell_readme,
    "docs/getting-started.md": shell_getting_started,
    "docs/stores.md": shell_stores,
    "docs/resume.md": shell_resume,
    "docs/nightly.md": shell_nightly,
    "docs/search.md": shell_search,
    "docs/evaluation.md": shell_evaluation,
    "docs/serving.md": shell_serving,
    "docs/dask.md": shell_dask,
}


def new_shard(workdir: Path) -> None:
    h5(workdir / "shards" / "day-3.h5", rows(400, seed=13))


#: What happens before a block, as its page says (``"Later, when ... new shards arrived"``): (page, a
#: command of the block) -> what changes the inputs.
SHELL_BEFORE = {("docs/resume.md", "--update model.npz"): new_shard}
#: What a block needs beyond the test extra (the torch tier installs it): a command fragment -> the module.
SHELL_NEEDS = {"--append-to": "sentence_transformers", "--format sentence-transformers": "sentence_transformers"}
#: Files a page's fenced ``toml`` block holds, by the name on its first line (``# job.toml``): written as is.
TOML_NAME = re.compile(r"^# (\S+\.toml)$")


def write_toml_blocks(doc: str, workdir: Path) -> None:
    """The page's job files, written from its own ``toml`` blocks (so the job the page runs is the one it shows)."""
    for _, lang, text, _ in code_blocks(REPO / doc):
        named = TOML_NAME.match(text.splitlines()[0]) if lang == "toml" else None
        if named:
            (workdir / named.group(1)).write_text(text)


def shell_env(bin_dir: Path) -> dict:
    """The environment a block runs in: ``streamwhiten`` is this worktree's, ``python`` this interpreter."""
    import sys

    bin_dir.mkdir()
    shim = bin_dir / "streamwhiten"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m streamwhiten "$@"\n')
    shim.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    # One OpenMP thread, as the python blocks run with one BLAS thread: on a busy 2-core machine faiss's
    # spinning OpenMP threads made training the page's OPQ code several times slower (the tool's own threads
    # are its own: --threads, --workers).
    return dict(os.environ, PATH=path, PYTHONPATH=pythonpath, HF_HUB_OFFLINE="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1")


SHELL_SITE = {  # the same stand-ins for a command line (the scheduler on TCP: the command is another process)
    "http://minio:9000": SITE["http://minio:9000"],
    "tcp://head:8786": lambda site, workdir: site("tcp://head:8786 (tcp)"),
    "/shared/": lambda site, workdir: f"{workdir}/shared/",
}
SHELL_PAGES = sorted({block.doc for block in SHELL_BLOCKS})


@pytest.mark.slow
@pytest.mark.parametrize("doc", SHELL_PAGES)
def test_shell_blocks_run(doc, tmp_path, site):
    """Every shell block of the page runs as written, in order, in one folder holding the page's inputs:
    bash stops at the first command that fails, and so does the page."""
    import subprocess
    import time

    workdir = tmp_path / "work"
    workdir.mkdir()
    SHELL_PREPARE[doc](workdir, site)
    write_toml_blocks(doc, workdir)
    env = shell_env(tmp_path / "bin")
    left_out = []
    for block in (b for b in SHELL_BLOCKS if b.doc == doc and not b.not_run):
        needed = sorted({module for text, module in SHELL_NEEDS.items() if text in block.code})
        if any(importlib.util.find_spec(module) is None for module in needed):
            left_out.append(f"{doc}:{block.line} needs {', '.join(needed)} (the torch tier installs it)")
            continue
        for (page, command), change in SHELL_BEFORE.items():
            if page == doc and command in block.code:
                change(workdir)
        script = block.code
        for placeholder, stand_in in SHELL_SITE.items():
            if placeholder in script:
                script = script.replace(placeholder, stand_in(site, workdir))
        start = time.perf_counter()
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        print(f"{doc}:{block.line}: exit {done.returncode} in {time.perf_counter() - start:.1f} s")
        assert done.returncode == 0, f"{doc}:{block.line} failed as written:\n{script}\n{done.stdout}\n{done.stderr}"
    if left_out:
        pytest.skip("; ".join(left_out))


# ----------------------------------------------------------------------------- the page on the STS-B data

#: A marker of each data set in the tests' code (a path fragment), most specific first.
DATA_MARKS = {
    "neighbours-dev": "stsb/neighbours-dev/",
    "retrieval-dev": "stsb/retrieval-dev/",
    "sts-dev.csv": "stsb/sts-dev.csv",
    "stsb-dev-minilm.h5": "stsb/stsb-dev-minilm.h5",
}


def data_of(text: str) -> str | None:
    return next((data for mark, data in DATA_MARKS.items() if mark in text), None)


def tests_needing_data() -> set[tuple[str, str]]:
    """``(test, data)`` for every test function that reads the STS-B data, from the tests' code: one that
    takes the ``stsb_path`` fixture, or reads a module constant that names a data set (directly or
    through another constant), or names ``neighbours-dev``/``retrieval-dev`` itself."""
    found = set()
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        constants: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                text = ast.get_source_segment(source, node.value) or ""
                named = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & set(constants)
                data = data_of(text) or next((constants[name] for name in sorted(named)), None)
                if data:
                    constants[node.targets[0].id] = data
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            test = f"{path.relative_to(REPO).as_posix()}::{node.name}"
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            strings = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            found |= {(test, constants[name]) for name in names & set(constants)}
            found |= {
                (test, DATA_MARKS[m]) for m in ("neighbours-dev", "retrieval-dev") if any(m in s for s in strings)
            }
            if "stsb_path" in [arg.arg for arg in node.args.args]:
                found.add((test, DATA_MARKS["stsb-dev-minilm.h5"]))
    return found


NUMBERS = {"Nine": 9, "Ten": 10, "Eleven": 11, "Twelve": 12, "Eight": 8, "Seven": 7, "Six": 6, "Five": 5}


def test_getting_started_names_every_test_that_needs_the_stsb_data():
    """The page's table of the tests that need the STS-B data, and its count of them, are the tests' code:
    a new test that reads the data (or one that stops) changes the page."""
    page = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = page[page.index("### Tests that need the STS-B data") :]
    section = section[: section.index("\n#")]
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")] if line.startswith("| `stsb/") else []
        for test in re.findall(r"`(tests/[^`]+::\w+)`", cells[2] if cells else ""):
            table[(test, cells[0].strip("`"))] = True
    assert set(table) == tests_needing_data()
    count = re.search(r"(\w+) tests \(test functions", section).group(1)
    assert NUMBERS[count] == len({test for test, _ in table})
    assert "STREAMWHITEN_STSB" in section and "../shared/data/stsb/" in section


# ----------------------------------------------------------------------------- docstrings on the API page

SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const|ref|term):`")
AUTOREF = re.compile(r"\[`[^`\]]+`\]\[([\w.]+)\]")


def test_no_sphinx_roles_in_the_package():
    """mkdocstrings renders docstrings as markdown, where ``:class:`X``` stays raw text: cross-references
    are autorefs links (``[`X`][streamwhiten.module.X]``) or plain backticks."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "streamwhiten").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if SPHINX_ROLE.search(line)
    ]
    assert found == []


def exists(dotted: str) -> bool:
    """Whether ``a.b.C.d`` names something: the longest importable module, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_docstring_links_point_at_what_the_api_page_renders():
    """Each autorefs link of a docstring names an object that exists and that the API page renders (a
    public name of ``streamwhiten.__all__`` or a public member of one), so ``mkdocs build --strict`` finds it."""
    from streamwhiten import _PUBLIC

    rendered = [module if attribute is None else f"{module}.{attribute}" for module, attribute in _PUBLIC.values()]
    links = {
        (path.relative_to(REPO).as_posix(), target)
        for path in sorted((REPO / "streamwhiten").rglob("*.py"))
        for target in AUTOREF.findall(path.read_text(encoding="utf-8"))
    }
    assert len(links) >= 30
    wrong = []
    for where, target in sorted(links):
        root = next((r for r in rendered if target == r or target.startswith(r + ".")), None)
        if root is None or any(part.startswith("_") for part in target[len(root) :].split(".")):
            wrong.append(f"{where}: {target} is not on the API page")
            continue
        if not exists(target):
            wrong.append(f"{where}: {target} does not exist")
    assert wrong == []


def test_the_site_says_where_it_is_served():
    """``site_url`` is set: without it 404.html, served for any missing path, links its styles, scripts and
    pages from the server's root, which breaks under any other path."""
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    site_url = re.search(r"^site_url: (\S+)$", config, re.M)
    assert site_url and re.match(r"^https://[^/]+/(.+/)?$", site_url.group(1)), "mkdocs.yml: no site_url"

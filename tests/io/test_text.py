"""A column of a CSV/TSV file read as a vector (gold scores, qrels): ``file.csv:NAME`` (header field) or
``file.tsv:INDEX`` (0-based, no header); bad values are one line naming the file and line."""

import os
import pathlib

import numpy as np
import pytest
from conftest import REPO

from streamwhiten.errors import BadInputError
from streamwhiten.io import read_vector
from streamwhiten.io.text import read_rows

STS_DEV = pathlib.Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
STS_DEV = STS_DEV.parent / "sts-dev.csv"


def test_an_index_reads_every_line_of_a_tab_separated_csv_with_stray_quotes(tmp_path):
    """STS-B's layout: tabs, no header, no quoting (a sentence holds one double quote), some lines longer."""
    path = tmp_path / "sts.csv"
    path.write_text(
        'main-captions\tMSRvid\t2012test\t0000\t5.000\tA man "with a hat.\tA man.\n'
        "main-news\theadlines\t2013\t0001\t0.5\tB, b\tC\tsource\textra\n"
        "\n"  # a blank line is skipped but counted
        "main-forum\tdeft\t2014\t0002\t 3.25 \tD\tE\n"
    )
    values, label = read_vector(f"{path}:4")
    assert values.tolist() == [5.0, 0.5, 3.25]
    assert label == f"{path}:4"


def test_a_header_name_reads_a_comma_separated_file_with_quoted_commas(tmp_path):
    path = tmp_path / "gold.csv"
    path.write_text('id,text,score\n1,"a, quoted ""text""",0.25\n2,plain,1e-3\n')
    values, label = read_vector(f"{path}:score")
    assert values.tolist() == [0.25, 0.001]
    assert label == f"{path}:score"
    assert read_rows(str(path))[1] == (2, ["1", 'a, quoted "text"', "0.25"])


def test_a_tsv_column_by_name_and_by_index(tmp_path):
    path = tmp_path / "qrels.tsv"
    path.write_text("query-id\tcorpus-id\tscore\r\n0\t5\t1\r\n1\t7\t2\r\n")
    assert read_vector(f"{path}:score")[0].tolist() == [1.0, 2.0]
    assert read_vector(f"{path}:corpus-id")[0].tolist() == [5.0, 7.0]


@pytest.mark.parametrize(
    "text, spec, message",
    [
        ("a\t1\nb\tx2\n", ":1", "{path}:1: line 2: 'x2' is not a number"),
        ("a\t1\n\n\nb\t\n", ":1", "{path}:1: line 4: '' is not a number"),
        ("a\t1\nb\n", ":1", "{path}:1: line 2: has 1 field(s), so no column 1 (0-based)"),
        (
            "name\tscore\nb\t2\n",
            ":1",
            "{path}:1: line 1: 'score' is not a number (an index reads every line as data; "
            "name the column to skip a header line)",
        ),
        (
            "name\tscore\nb\t2\n",
            ":scores",
            "{path}:scores: line 1: no header field is named 'scores'; the fields are 'name', 'score' "
            "(or give a 0-based index for a file without a header)",
        ),
        ("", ":score", "{path}:score: the file is empty: no header line to find column 'score' in"),
        (
            "a\t1\n",
            "",
            "{path}: no column named; its first line has 2 field(s): 'a', '1': write {path}:NAME for a header "
            "field, or {path}:INDEX for a 0-based column (every line data)",
        ),
    ],
)
def test_bad_columns_and_values_are_one_line_naming_file_and_line(tmp_path, text, spec, message):
    path = tmp_path / "scores.tsv"
    path.write_text(text)
    with pytest.raises(BadInputError) as caught:
        read_vector(f"{path}{spec}")
    assert str(caught.value) == message.format(path=path)


def test_a_missing_file_and_bad_utf8(tmp_path):
    with pytest.raises(BadInputError, match=r"nope\.csv: no such file or directory$"):
        read_vector(f"{tmp_path}/nope.csv:1")
    path = tmp_path / "latin.csv"
    path.write_bytes(b"1\n2\n\xe9\n")
    with pytest.raises(BadInputError, match=r"latin\.csv: line 3: not UTF-8 text$"):
        read_vector(f"{path}:0")


def test_a_csv_column_on_s3_reads_as_a_local_one(tmp_path, s3_bucket, s3_server):
    from conftest import s3fs_client

    text = "name\tscore\na\t1.5\nb\t-2\n"
    (tmp_path / "s.tsv").write_text(text)
    s3fs_client(s3_server).pipe(f"{s3_bucket[5:]}/gold/s.tsv", text.encode())
    remote, label = read_vector(f"{s3_bucket}/gold/s.tsv:score")
    assert remote.tolist() == read_vector(f"{tmp_path}/s.tsv:score")[0].tolist() == [1.5, -2.0]
    assert label == f"{s3_bucket}/gold/s.tsv:score"


def test_the_sts_dev_gold_scores_as_the_benchmark_ships_them():
    """sts-dev.csv:4 holds the 1,500 gold scores, as splitting each line at tabs gives them."""
    if not STS_DEV.exists():
        pytest.skip(f"STS-B csv files not found at {STS_DEV} (licensed data kept out of the repo)")
    values, _ = read_vector(f"{STS_DEV}:4")
    expected = [float(line.split("\t")[4]) for line in STS_DEV.read_text().split("\n") if line.strip()]
    assert values.shape == (1500,) and values.tolist() == expected
    h5 = STS_DEV.parent / "stsb-dev-minilm.h5"
    if h5.exists():
        np.testing.assert_allclose(values, read_vector(f"{h5}:/score")[0], rtol=0, atol=1e-6)


def test_eval_scores_pairs_against_a_csv_column(tmp_path, run_cli):
    """The pair evaluation reads its gold scores from a CSV column as from an HDF5 dataset."""
    from conftest import anisotropic, write_h5

    a = anisotropic(40, 6, seed=1).astype(np.float32)
    b = (a + anisotropic(40, 6, seed=2)).astype(np.float32)
    gold = np.random.default_rng(3).random(40)
    (tmp_path / "gold.csv").write_text("".join(f"x\ty\t{value!r}\n" for value in gold.tolist()))
    spec_a, spec_b = write_h5(tmp_path / "a.h5", a), write_h5(tmp_path / "b.h5", b)
    write_h5(tmp_path / "gold.h5", gold[:, None])
    code, out_csv, err = run_cli(
        "eval", "--pairs-a", spec_a, "--pairs-b", spec_b, "--scores", f"{tmp_path}/gold.csv:2", "--json"
    )
    assert code == 0, err
    code, out_h5, err = run_cli(
        "eval", "--pairs-a", spec_a, "--pairs-b", spec_b, "--scores", f"{tmp_path}/gold.h5:/emb", "--json"
    )
    assert code == 0, err
    import json

    assert json.loads(out_csv)["raw"] == json.loads(out_h5)["raw"]
    code, _, err = run_cli("eval", "--pairs-a", spec_a, "--pairs-b", spec_b, "--scores", f"{tmp_path}/gold.csv:1")
    assert (
        code == 2
        and err
        == f"streamwhiten: error: {tmp_path}/gold.csv:1: line 1: 'y' is not a number (an index reads every line as data; name the column to skip a header line)\n"
    )

"""A week of nightly whitening runs, compressed into a minute: what cron would do with scripts/nightly.sh.

    python examples/nightly/simulate_nights.py            # 5 nights in a temporary copy of this folder
    python examples/nightly/simulate_nights.py --nights 7 --rows 50000 --workdir /tmp/nightly

In production the crontab line is

    15 2 * * *  /srv/whitening/scripts/nightly.sh /srv/whitening/job.toml >> /srv/whitening/cron.log 2>&1

Each simulated night writes one new shard (``shards/day-N.h5``) and runs ``streamwhiten run job.toml``:
the first night fits the model; later nights read only the new shard's rows into it (``--update``) and,
since the map changed, whiten every shard again with it; a second run the same night has nothing to do (exit 3); a run killed half-way
would resume on the next one (see the README's "Nightly batch runs"). At the end the model updated
night by night is compared with one fitted on every shard at once: the statistics are the same.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def run(job: str, log: str) -> int:
    """One cron run; its progress lines and any one-line error go to the log, as with nightly.sh."""
    with open(log, "a") as handle:
        return subprocess.run(
            [sys.executable, "-m", "streamwhiten", "run", job, "--quiet"], stdout=handle, stderr=handle
        ).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20_000, help="rows per nightly shard")
    parser.add_argument("--dim", type=int, default=256, help="embedding width (more than the k = 64 of job.toml)")
    parser.add_argument("--workdir", help="where the job runs (default: a temporary directory)")
    args = parser.parse_args(argv)

    from streamwhiten import load_model
    from streamwhiten.synthetic import write_store

    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or scratch
        os.makedirs(os.path.join(work, "shards"), exist_ok=True)
        job = shutil.copy(os.path.join(HERE, "job.toml"), os.path.join(work, "job.toml"))
        log = os.path.join(work, "nightly.log")
        for night in range(1, args.nights + 1):
            write_store(os.path.join(work, "shards", f"day-{night}.h5"), args.rows, args.dim, seed=night)
            first, again = run(job, log), run(job, log)
            print(f"night {night}: run exit {first}, second run the same night exit {again} (3: nothing to do)")
            if first != 0 or again != 3:
                print(open(log).read(), file=sys.stderr)
                return 1

        nightly = load_model(os.path.join(work, "models", "whitening.npz"))
        shards = sorted(os.path.join(work, "shards", name) for name in os.listdir(os.path.join(work, "shards")))
        at_once = os.path.join(work, "at-once.npz")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "streamwhiten",
                "fit",
                *[f"{s}:/embeddings" for s in shards],
                "-o",
                at_once,
                "-k",
                "64",
                "--quiet",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        reference = load_model(at_once)
        mean_gap = float(np.max(np.abs(nightly.mean - reference.mean)))
        cov_gap = float(np.max(np.abs(nightly.covariance - reference.covariance)))
        reduced = sorted(os.listdir(os.path.join(work, "reduced")))
        print(
            f"{nightly.n_rows} rows in the nightly model; fitted at once: max |mean gap| {mean_gap:.2e}, "
            f"max |covariance gap| {cov_gap:.2e}; whitened shards: {', '.join(reduced)}"
        )
        return 0 if nightly.n_rows == reference.n_rows and cov_gap < 1e-9 and len(reduced) == args.nights else 1


if __name__ == "__main__":
    sys.exit(main())

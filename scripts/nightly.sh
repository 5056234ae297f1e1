#!/usr/bin/env bash
# Nightly streamwhiten batch run, ready for cron. Example crontab line (02:15 every night):
#
#   15 2 * * *  /srv/whitening/scripts/nightly.sh /srv/whitening/job.toml >> /srv/whitening/cron.log 2>&1
#
# The job file says what to read, which model to keep up to date and where to write the reduced
# vectors (see scripts/job.example.toml). Each night only rows appended since the last run are read;
# a run that was killed resumes where it stopped; a second run while one is going exits at once.
#
# Environment: STREAMWHITEN_VENV (a virtualenv with streamwhiten installed, default: .venv beside this
# repository), STREAMWHITEN_LOG (log file, default: nightly.log beside the job file).
set -uo pipefail

job=${1:?usage: nightly.sh JOB.toml}
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${STREAMWHITEN_VENV:-$here/.venv}
log=${STREAMWHITEN_LOG:-$(dirname "$job")/nightly.log}

# shellcheck disable=SC1091
[ -f "$venv/bin/activate" ] && . "$venv/bin/activate"

# Timestamped progress lines and the one-line error (if any) both go to the log.
streamwhiten run "$job" --quiet 2>>"$log"
status=$?
case $status in
  0)   echo "$(date -Is) nightly: done" ;;
  3)   echo "$(date -Is) nightly: nothing new to do"; status=0 ;;
  75)  echo "$(date -Is) nightly: the previous run is still going; skipped"; status=0 ;;
  130) echo "$(date -Is) nightly: interrupted; progress saved, the next run resumes" ;;
  2)   echo "$(date -Is) nightly: bad input, see $log" ;;
  *)   echo "$(date -Is) nightly: failed with exit code $status, see $log" ;;
esac
exit $status

# A study's real multi-GPU cells that have no profile yet, run again on one host, each cell alone on it,
# one at a time, with the study's `profile_steps`: `bash profile-cells.sh <study> [<cells, an extended
# grep pattern>]` (rerun-cells.sh, which says what goes to $OUT).
exec bash "$(dirname "$0")/rerun-cells.sh" "${1:?a study}" unprofiled "${2:-.}"

# Every measured cell of a study run again on one host, each cell alone on it, one at a time, the one-GPU
# cells first, so that scaling is against the one-GPU cell of the same host and boot:
# `bash rerun-study.sh <study>` (rerun-cells.sh, which says what goes to $OUT).
exec bash "$(dirname "$0")/rerun-cells.sh" "${1:?a study}" all

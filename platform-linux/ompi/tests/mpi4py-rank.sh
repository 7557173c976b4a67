#!/bin/sh
# One rank of mpi4py's own test suite (its test/ directory, from the PyPI
# source release of the installed mpi4py), verbose, into its own log:
#   mpi4py-rank.sh SUITE_DIR LOG_DIR [runtests.py options...]
# Run under mpirun; each rank writes LOG_DIR/rank.N (N = its world rank),
# so that per-test results can be read rank by rank.
suite=$1
logs=$2
shift 2
exec /usr/bin/python3 "$suite/test/runtests.py" --no-builddir -v "$@" \
  >"$logs/rank.${OMPI_COMM_WORLD_RANK:-x}" 2>&1

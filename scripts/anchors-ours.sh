# btl's rows for the anchor harness in ../shared/anchors (see its README):
#   cargo build --release -p btl-cli
#   ANCHORS_EXTRA=$PWD/scripts/anchors-ours.sh ANCHOR_GROUPS="mpi ucx" \
#     OUT_MD=/tmp/anchors_out/RESULTS.md OUT_TSV=/tmp/anchors_out/results_raw.tsv \
#     bash ../shared/anchors/run_anchors.sh
# Each row runs `btl bench --format osu`, which launches 2 ranks pinned to
# cores 0 and 1. Plot the result beside btl's own curves:
#   target/release/btl bench --transport sm,tcp --plot bench.svg \
#     --compare /tmp/anchors_out/results_raw.tsv --compare-ids ompi_tcp,ucp_tcp,btl_tcp
# The rows beside the peers' make the comparison one interleaved run on one
# machine; the current figures are in BENCHMARKS.md
# (bench/results/10-btl-against-peers.tsv). The shared-memory footprint
# series (btl against vader, same workload) is the sibling script
# scripts/shm-memory.sh.
BTL_BIN=${BTL_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/release/btl}
extra_all() {
    row btl_sm "btl sm (default)" "btl bench --transport sm with default parameters: single copy (process_vm_readv) or the pipelined copy, as measured, from min_rdma_pipeline_size (68 KiB) up, split with the sender (process_vm_writev into a landing buffer) from cma_split_min (128 KiB), fragments below"
    run_mpi btl_sm 120 "$BTL_BIN" bench --transport sm --format osu
    row btl_sm_nocma "btl sm, use_cma=0" "btl bench --transport sm with BTL_SM_USE_CMA=0: messages above 64 KiB pipelined through 64 KiB shared fragments"
    run_mpi btl_sm_nocma 120 env BTL_SM_USE_CMA=0 "$BTL_BIN" bench --transport sm --format osu
    row btl_tcp "btl tcp (lo)" "btl bench --transport tcp over loopback, default parameters (sndbuf/rcvbuf 0: the kernel's autotuning)"
    run_mpi btl_tcp 120 "$BTL_BIN" bench --transport tcp --format osu
    row btl_tcp_128k "btl tcp (lo), 128 KiB buffers" "btl bench --transport tcp with BTL_TCP_SNDBUF=128k BTL_TCP_RCVBUF=128k (the seed's default, which caps the window)"
    run_mpi btl_tcp_128k 120 env BTL_TCP_SNDBUF=128k BTL_TCP_RCVBUF=128k "$BTL_BIN" bench --transport tcp --format osu
}

# What the GPU scripts need around a device call (sourced by step_h100.sh, megatron_h100.sh, sglang_h100.sh).
# A call lasts at most 10 minutes and the machine is given back 30 s after one ends, so longer work starts
# detached in one call and is waited for in the next ones; a call brings back at most 8 files.
#
#   chain_start "VAR=value ..."   run `bash $0 $CHAIN` detached with those assignments; $OUT/chain.done when over
#   chain_wait SECONDS LINES      wait up to $WAIT seconds (default SECONDS) for it; then chain.log's last LINES
#   pack_out                      everything under $OUT into $OUT/results.tgz alone

chain_start() {
  rm -f "$OUT/chain.done"
  setsid nohup bash -c "$1 bash $0 ${CHAIN:?CHAIN=stages}; touch $OUT/chain.done" > "$OUT/chain.log" 2>&1 &
  echo "chain started ($CHAIN): $!" | tee -a "$OUT/commands.txt"
}

chain_wait() {
  for _ in $(seq "${WAIT:-$1}"); do [ -f "$OUT/chain.done" ] && break; sleep 1; done
  [ -f "$OUT/chain.done" ] && echo "chain done" || echo "chain still running"
  tail -n "$2" "$OUT/chain.log"
}

pack_out() {
  tar -C "$OUT" -czf /tmp/results.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
}

# What the benchmarks share; sourced once they have set `testbed` and
# `liqoctl` (the binaries) and `dir` (their scratch folder, the testbed's
# clusters in $dir/tb).

# The kubeconfig of testbed cluster $1.
kubeconfig() { "$testbed" get --dir "$dir/tb" "$1" kubeconfig; }

# Installs liqo-rs on each testbed cluster named, its agents on the
# host-process nodes; on failure shows install's output and fails.
install_on() {
  local cluster
  for cluster in "$@"; do
    "$liqoctl" --kubeconfig "$(kubeconfig "$cluster")" install --cluster-id "$cluster" \
      --cluster-name "$cluster" --pod-cidr "$("$testbed" get --dir "$dir/tb" "$cluster" pod-cidr)" \
      --node-selector testbed.liqo.io/host-process=true \
      --toleration testbed.liqo.io/host-process=true:NoSchedule --timeout 120 --yes \
      >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; return 1; }
  done
}

# The consumer's virtual kubelet's PID: the process whose KUBECONFIG lies
# in the consumer's testbed folder (none: empty).
vk_pid() {
  local pid env
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = liqo-virtual-ku ] || continue
    env=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" || true)
    if grep -q "^KUBECONFIG=$dir/tb/consumer/" <<<"$env"; then
      echo "$pid"
      return 0
    fi
  done
}

# What the benchmarks share; sourced from the repository's root.

# Builds the workspace's binaries with profile $1 (release or debug),
# passing cargo any further arguments (e.g. --features), and sets what
# the other functions use: `toolchain` (exported for the
# testbed), `testbed`, `liqoctl`, `kubectl`, and `dir`, a scratch folder
# (the testbed's clusters in $dir/tb).
bench_build() {
  local profile=$1 flags=(--quiet --locked --workspace --bins)
  shift
  [ "$profile" = release ] && flags+=(--release)
  flags+=("$@")
  toolchain=$(bash tests/setup.sh | tail -n 1)
  export LIQO_TOOLCHAIN_DIR="$toolchain"
  cargo build "${flags[@]}"
  testbed=target/$profile/liqo-testbed
  liqoctl=target/$profile/liqoctl
  kubectl="$toolchain/kubectl"
  dir=$(mktemp -d)
}

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

# With the testbed's clusters consumer and provider up: liqo-rs
# installed on both, the consumer peered with the provider and its
# namespace bench offloaded; sets `consumer` and `provider` (their
# kubeconfigs). On failure shows the command's output and fails.
offload_bench() {
  consumer=$(kubeconfig consumer)
  provider=$(kubeconfig provider)
  install_on consumer provider
  "$liqoctl" --kubeconfig "$consumer" peer --remote-kubeconfig "$provider" --timeout 120 --yes \
    >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log" >&2; return 1; }
  "$kubectl" --kubeconfig "$consumer" create namespace bench >/dev/null
  "$liqoctl" --kubeconfig "$consumer" offload namespace bench --wait --timeout 120 \
    >"$dir/offload.log" 2>&1 || { cat "$dir/offload.log" >&2; return 1; }
}

# The Deployment in namespace $1, on the virtual node when $2 is
# "virtual"; named and labelled app=$3 (default bench), of $4 replicas
# (default $pods, the benchmark's N).
deployment() {
  local ns=$1 where=$2 name=${3:-bench} replicas=${4:-$pods} placement=""
  if [ "$where" = virtual ]; then
    placement='
      nodeSelector: { liqo.io/virtual-node: "true" }
      tolerations: [{ key: virtual-node.liqo.io/not-allowed, operator: Exists, effect: NoExecute }]'
  fi
  cat <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: { name: $name, namespace: $ns }
spec:
  replicas: $replicas
  selector: { matchLabels: { app: $name } }
  template:
    metadata: { labels: { app: $name } }
    spec:$placement
      terminationGracePeriodSeconds: 0
      containers:
        - name: app
          image: nginx
          resources: { requests: { cpu: 1m, memory: 1Mi } }
EOF
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

# The consumer's virtual kubelet once it runs as a process other than
# PID $1 (restarted by its node): waits up to 5 minutes.
new_vk() {
  local pid
  for _ in $(seq 600); do
    pid=$(vk_pid)
    if [ -n "$pid" ] && [ "$pid" != "$1" ]; then
      echo "$pid"
      return 0
    fi
    sleep 0.5
  done
  echo "the virtual kubelet did not start again" >&2
  return 1
}

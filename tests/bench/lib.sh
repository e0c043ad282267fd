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

# Builds the shipped images (release, static: `liqo-images`) into
# target/images, installing the musl target and musl-tools first if
# needed; sets `images` to that folder.
shipped_images() {
  rustup target list --installed | grep -q '^x86_64-unknown-linux-musl$' \
    || rustup target add x86_64-unknown-linux-musl
  command -v musl-gcc >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools
  }
  cargo run --locked -q -p liqo-images >/dev/null
  images=$PWD/target/images
}

# Stops the watches and the testbed's clusters, and removes the scratch
# folder: each benchmark's EXIT trap.
bench_cleanup() {
  stop_watchers
  "$testbed" down --dir "$dir/tb" >/dev/null 2>&1 || true
  rm -rf "$dir"
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
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        seccompProfile: { type: RuntimeDefault }
      containers:
        - name: app
          image: nginx
          resources: { requests: { cpu: 1m, memory: 1Mi } }
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: { drop: [ALL] }
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

# The cluster (testbed folder) process $1 belongs to, as its command line
# or environment names it, or else as the cgroup of a real node's pods
# does (the cgroup root its kubelet was given); nothing for a process of
# no cluster. Callers that ask for many processes set `node_roots` to
# node_cgroups's lines first.
cluster_of() {
  local where root roots=${node_roots-$(node_cgroups)}
  where=$({ tr '\0' '\n' <"/proc/$1/cmdline"; tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null |
    grep -o "$dir/tb/[a-z]*/" | head -n 1 | sed "s|$dir/tb/||; s|/$||") || true
  if [ -z "$where" ] && [ -n "$roots" ]; then
    root=$(awk -F: '$1 == 0 { split($3, p, "/"); print "/" p[2] }' "/proc/$1/cgroup" 2>/dev/null) || true
    where=$(awk -v r="$root" '$1 == r { print $2 }' <<<"$roots")
  fi
  echo "$where"
}

# "<cgroup root> <cluster>" for each real node of the testbed.
node_cgroups() {
  local config
  for config in "$dir"/tb/*/node/kubelet.json; do
    [ -e "$config" ] || continue
    echo "$(jq -r '.cgroupRoot' "$config") $(basename "$(dirname "$(dirname "$config")")")"
  done
}

# Each cluster's processes (all their threads) on cores of their own, as
# peered clusters have machines of their own: arguments "cluster=cores"
# (taskset's list, e.g. home=0 foreign=1). A real node's pods are
# included; processes started later by one (a `kubectl exec`) inherit its
# shim's cores.
pin_clusters() {
  local pid where pair node_roots
  node_roots=$(node_cgroups)
  declare -A cores=()
  for pair in "$@"; do cores[${pair%%=*}]=${pair#*=}; done
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    where=$(cluster_of "$pid")
    [ -n "$where" ] && [ -n "${cores[$where]:-}" ] || continue
    taskset -a -p -c "${cores[$where]}" "$pid" >/dev/null 2>&1 || true
  done
}

# CPU time so far of every process of the testbed, one line each:
# "<cluster>/<program> <ticks>" (utime + stime, in clock ticks).
cpu_ticks() {
  local pid where comm node_roots
  node_roots=$(node_cgroups)
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    where=$(cluster_of "$pid")
    [ -n "$where" ] || continue
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    awk -v w="$where/$comm" '{ sub(/^.*\) /, ""); print w, $12 + $13 }' "/proc/$pid/stat" 2>/dev/null || true
  done
}

# CPU seconds per program between two cpu_ticks files ($1 before, $2
# after), largest first, as "program seconds" lines.
cpu_spent() {
  local hz
  hz=$(getconf CLK_TCK)
  awk -v hz="$hz" 'NR == FNR { before[$1] += $2; next } { after[$1] += $2 }
    END { for (p in after) printf "%s %.1f\n", p, (after[p] - before[p]) / hz }' "$1" "$2" |
    sort -k2 -n -r
}

watchers=()
# Stops the watches: each loop of `stamped`, then its kubectl.
stop_watchers() {
  local pid children
  for pid in "${watchers[@]}"; do
    children=$(pgrep -P "$pid" || true)
    kill "$pid" $children 2>/dev/null || true
  done
  watchers=()
}
# Seconds from now until `want` ($2) pods are Running in the watch file
# $1 (lines "time uid node phase" of `stamped`); fails after 30 minutes.
# Counting from a watch the script runs anyway costs the API server
# nothing more, where listing every pod twice a second cost it more than
# what was measured.
until_running() {
  local file=$1 want=$2 start now
  start=$(date +%s.%N)
  for _ in $(seq 9000); do
    if [ "$(awk '$4 == "Running" && !seen[$2]++ { n++ } END { print n + 0 }' "$file" 2>/dev/null)" -ge "$want" ]; then
      now=$(date +%s.%N)
      awk "BEGIN { printf \"%.1f\", $now - $start }"
      return 0
    fi
    sleep 0.2
  done
  echo "timed out waiting for $want Running pods in $file" >&2
  return 1
}

# Starts `kubectl "$@"` (a `get -w`) in the background, each line it
# prints written to file $1 with the time it was seen (its errors to
# $1.err); the watch is stopped with the others. A watch the API server
# ends (seen once with 1,000 pods starting under a raised
# --kcm-qps) is started again, at most 20 times: it lists every object
# again, so a pod's first time seen in a phase is never earlier than
# when it got there.
stamped() {
  local out=$1
  shift
  (
    for _ in $(seq 20); do
      "$kubectl" "$@" 2>>"$out.err"
      echo "$(date +%T) watch ended ($?), started again" >>"$out.err"
      sleep 0.5
    done
  ) > >(perl -MTime::HiRes=time -ne '$|=1; printf "%.3f %s", time, $_' >"$out") &
  watchers+=($!)
}

# Stops the watches started with `stamped`.
unwatch() {
  sleep 2
  stop_watchers
}

# Requests the API server of kubeconfig $1 has served so far, one line
# each: "<verb> <resource>[/<subresource>] <count>" (from its
# apiserver_request_total; a watch counts when it ends). With $2, the
# metrics read are also kept in file $2, for other figures of the same
# moment.
api_requests() {
  "$kubectl" --kubeconfig "$1" get --raw /metrics | tee "${2:-/dev/null}" |
    awk '/^apiserver_request_total\{/ {
      verb = res = sub_ = ""
      if (match($0, /verb="[^"]*"/)) verb = substr($0, RSTART + 6, RLENGTH - 7)
      if (match($0, /resource="[^"]*"/)) res = substr($0, RSTART + 10, RLENGTH - 11)
      if (match($0, /subresource="[^"]*"/)) sub_ = substr($0, RSTART + 13, RLENGTH - 14)
      n[verb " " res (sub_ == "" ? "" : "/" sub_)] += $NF
    } END { for (k in n) print k, n[k] }' | sort
}

# Requests per pod between two api_requests files ($1 before, $2 after)
# for $3 pods: "<verb> <resource> <per pod>" lines, the most first, those
# of at least 0.05 per pod; then a total line.
requests_per_pod() {
  awk -v pods="$3" 'NR == FNR { before[$1 " " $2] = $3; next }
    { d = ($3 - before[$1 " " $2]) / pods; t += d; if (d >= 0.05) printf "%s %s %.2f\n", $1, $2, d }
    END { printf "total - %.2f\n", t }' "$1" "$2" | sort -k3 -n -r
}

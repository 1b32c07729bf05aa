#!/usr/bin/env bash
# Runs the cluster commands of docs/cluster.md ("Running on a Ray cluster", steps 1-4) as written, on
# this one machine: the head and three workers as separate `ray start` processes, the
# cluster.yaml of step 2, both launches of step 3 (`agentrl train` with the env module on
# PYTHONPATH, and `ray job submit`), then `ray stop`. Each `agentrl train` gets the tiny model
# for one iteration and a user env module that only the launching shell can import
# (AGENTRL_CLUSTER_CHECK_OVERRIDES adds more overrides).
#
# It runs in its own pid, mount and network namespaces (unshare; needs root): `ray stop` ends
# only the Ray processes started here, port 6379/8265 are its own, /tmp/ray and ~/.ray (the
# auth token) are private tmpfs mounts, and when the script ends, however it ends, the kernel
# ends every process it started (they die with the namespace's first process).
#
# Each worker node (`ray start --address`) gets a /tmp/ray of its own (a mount namespace of
# its own), as a node on another machine has. Nodes that share one temp dir share its
# runtime_resources, and Ray 2.60 re-extracts a job's working_dir there (rmtree, then unzip)
# the first time each node's runtime env agent sees it: that removes the directory the
# `ray job submit` driver runs in (its cwd) while it runs, and the driver dies at its first
# getcwd() (torch's MKL: "Intel oneMKL FATAL ERROR: Cannot load .../libtorch_cpu.so").
#
# Usage: bash scripts/cluster_check.sh        (exit 0: every command worked)
#   AGENTRL_CLUSTER_CHECK_LOGS=DIR: when it ends, copy the head node's Ray logs and the
#   runs' directories to DIR/ray-head-logs and DIR/runs
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

if [ "${AGENTRL_CLUSTER_CHECK_INSIDE:-0}" != 1 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
    echo "cluster_check: needs root, unshare and ip (own pid/mount/network namespaces), so that 'ray stop'" \
         "and the ports of docs/cluster.md touch nothing else on this machine" >&2
    exit 2
  fi
  exec unshare --pid --fork --mount-proc --mount --net --propagation private \
    env AGENTRL_CLUSTER_CHECK_INSIDE=1 bash "$0" "$@"
fi

log() { echo "[cluster_check $(date +%H:%M:%S)] $*"; }

# A network of its own: one address on loopback and a default route through it, so Ray's
# node-IP detection (a UDP "connect" towards a public address) finds HEAD_IP.
HEAD_IP=10.77.0.1
ip link set lo up
ip addr add "$HEAD_IP/32" dev lo
ip route add default dev lo src "$HEAD_IP"
mkdir -p /tmp/ray "$HOME/.ray"
mount -t tmpfs tmpfs /tmp/ray
mount -t tmpfs tmpfs "$HOME/.ray"

WORK=$(mktemp -d /tmp/agentrl-cluster-check.XXXXXX)
keep_logs() {
  local dir=${AGENTRL_CLUSTER_CHECK_LOGS:-}
  [ -n "$dir" ] || return 0
  mkdir -p "$dir" && rm -rf "$dir/ray-head-logs" "$dir/runs"
  cp -r /tmp/ray/session_latest/logs "$dir/ray-head-logs" 2>/dev/null || true
  cp -r "$WORK/runs" "$dir/runs" 2>/dev/null || true
}
trap 'keep_logs; rm -rf "$WORK"' EXIT
ln -s "$REPO/.venv" "$WORK/.venv"
mkdir "$WORK/my_envs"
cat > "$WORK/my_envs/calc_env.py" <<'EOF'
"""A user's env module, importable only from the launching shell (PYTHONPATH or the job's working dir)."""
import gymnasium

gymnasium.register("calcuser/Calc-v0", entry_point="environments.shell_lookup:ShellLookupEnv")
EOF
TINY=$("$REPO/.venv/bin/agentrl" models prepare tiny-random-smollm2 | tail -1)

# The commands of docs/cluster.md, by step: the bash blocks and the YAML block of its section
# "Running on a Ray cluster".
"$REPO/.venv/bin/python" - "$REPO/docs/cluster.md" "$WORK" "$HEAD_IP" <<'EOF'
import re, sys
from pathlib import Path

page, work, head_ip = Path(sys.argv[1]).read_text(), Path(sys.argv[2]), sys.argv[3]
section = page.split("\n## Running on a Ray cluster\n", 1)[1].split("\n## ", 1)[0]
blocks = [(lang, re.sub(r"^ {3}", "", body, flags=re.M))
          for lang, body in re.findall(r"^ *```(\w+)\n(.*?)^ *```", section, flags=re.M | re.S)]
yaml = [b for lang, b in blocks if lang == "yaml"]
bash = [b.replace("HEAD_IP", head_ip) for lang, b in blocks if lang == "bash"]
nodes = [b for b in bash if "ray start" in b]
launches = [b for b in bash if "agentrl train" in b]
stop = [b for b in bash if "ray stop" in b]
if not (len(yaml) == 1 and len(nodes) == 1 and len(launches) == 2 and len(stop) == 1):
    sys.exit(f"docs/cluster.md's cluster section: expected 1 yaml, 1 'ray start', 2 'agentrl train' and 1 'ray stop' "
             f"blocks, found {len(yaml)}, {len(nodes)}, {len(launches)}, {len(stop)}")
(work / "cluster.yaml").write_text(yaml[0])
(work / "1-nodes.sh").write_text(nodes[0])
for i, b in enumerate(launches):
    # every `agentrl train` command (continuation lines joined) gets the check's overrides
    b = re.sub(r"(agentrl train(?:[^\n]|\\\n)*?)$", r"\1 $CHECK_OVERRIDES", b.replace("\\\n", " "), flags=re.M)
    (work / f"3-launch-{i}.sh").write_text(b)
(work / "4-stop.sh").write_text(stop[0])
EOF

cd "$WORK"
source .venv/bin/activate
export CHECK_OVERRIDES="model.path=$TINY run.iterations=1 env.import_modules=[calc_env] env.id=calcuser/Calc-v0
  env.tasks_per_iteration=2 env.group_size=2 rollout.max_turns=2 rollout.max_new_tokens=16
  rollout.max_context_tokens=1024 rollout.kv_cache_gb=0.125 sandbox.backend=bwrap
  eval.before_training=false eval.after_training=false ${AGENTRL_CLUSTER_CHECK_OVERRIDES:-}"
export OMP_NUM_THREADS=1 RAY_DISABLE_USAGE_STATS=1

# `ray start --address` (a worker node) runs with a private /tmp/ray (see the top), which its
# Ray processes keep; the head's /tmp/ray is the one `cluster.address: auto` reads here.
cat > separate-nodes.sh <<'END'
ray() {
  if [ "${1:-}" = start ] && [[ " $* " = *" --address "* ]]; then
    unshare --mount --propagation private bash -euc 'mount -t tmpfs tmpfs /tmp/ray; exec ray "$@"' ray "$@"
  else
    command ray "$@"
  fi
}
END
log "step 1: $(grep -c 'ray start' 1-nodes.sh) nodes"
bash -euo pipefail -c ". ./separate-nodes.sh; . ./1-nodes.sh"
RAY_AUTH_MODE=token ray status --address "$HEAD_IP:6379" | sed -n "/Resources/,/Demands/p"
for i in 0 1; do
  log "step 3, launch $((i + 1)): $(head -c 200 3-launch-$i.sh | tr '\n' ' ')"
  # -f: no globbing of the overrides' brackets (env.import_modules=[calc_env])
  CHECK_OVERRIDES="$CHECK_OVERRIDES run.dir=$WORK/runs/launch$i" bash -feuo pipefail "3-launch-$i.sh"
  test -f "$WORK/runs/launch$i/metrics.jsonl" || { log "launch $((i + 1)) wrote no metrics"; exit 1; }
done
log "step 4"
bash -euo pipefail 4-stop.sh
log "ok: the cluster commands of docs/cluster.md work as written"

#!/usr/bin/env bash
# Install the JAX SPMD lab kit on a workshop VM from its lock file, then prove the VM works with
# a smoke lab: lab 3's reference solution on the `tpu` configuration (on a CPU VM, on `cpu-8`).
#
# Terraform hands this file to every VM as its startup script, so it runs as root at every boot,
# on every worker of a TPU slice. It can also be run by hand, or locally in CPU mode:
#
#   LABKIT_REPO=/path/to/checkout LABKIT_HOME=/tmp/kit LABKIT_MODE=cpu LABKIT_SYSTEM_PACKAGES=0 \
#   LABKIT_LOG=/tmp/kit.log LABKIT_STATE=/tmp/kit-state bash infra/startup.sh
#
# Settings come from the environment, or else from the VM's metadata (keys labkit-repo,
# labkit-ref, labkit-mode, set by the Terraform modules):
#   LABKIT_REPO       git URL (or local path) of the kit                      (required)
#   LABKIT_REF        branch, tag or commit to check out                      (default: main)
#   LABKIT_MODE       tpu or cpu: `tpu` installs jax[tpu] (make setup EXTRAS=tpu) and smokes on tpu
#                     (default: tpu when the machine has TPU devices, else cpu)
#   LABKIT_HOME       where the kit goes                                      (default: /opt/labkit)
#   LABKIT_LOG        the log a TA reads                                      (default: /var/log/labkit-startup.log)
#   LABKIT_STATE      folder of the one-line status file `status`            (default: /var/lib/labkit)
#   LABKIT_SMOKE_LAB  the lab whose reference is the smoke test               (default: 3)
#   LABKIT_SMOKE_TIMEOUT  seconds the smoke notebook may run                  (default: 300)
#   LABKIT_SYSTEM_PACKAGES  0 skips apt-get (git, make, python3-venv)         (default: 1)
#   LABKIT_DEP_GROUPS the dependency groups of .venv (make setup DEP_GROUPS=...)  (default: notebook)
#   LABKIT_SYSTEM_ENV file that gives every login EXTRAS and DEP_GROUPS        (default: /etc/environment)
#   LABKIT_WORKERS    hosts in this TPU slice     (default: from the metadata key worker-network-endpoints)
#
# A TA reads how it went with:
#   gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all --command 'cat /var/lib/labkit/status'
#   gcloud compute tpus tpu-vm ssh NAME --zone ZONE --command 'cat /var/log/labkit-startup.log'
# (`make workshop-status` does the first for every VM). The status is `installing`, `ready: ...`
# or `failed: STEP (see LOG)`.
set -Eeuo pipefail

on_gce() {
  [[ -r /sys/class/dmi/id/product_name ]] && grep -q Google /sys/class/dmi/id/product_name
}

# One metadata attribute of this VM, or nothing (never asked off Google Cloud).
metadata() {
  on_gce || return 0
  curl -fsS --max-time 5 -H "Metadata-Flavor: Google" \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1" 2>/dev/null || true
}

has_tpu() {
  compgen -G "/dev/accel*" >/dev/null || compgen -G "/dev/vfio/[0-9]*" >/dev/null
}

LABKIT_LOG=${LABKIT_LOG:-/var/log/labkit-startup.log}
LABKIT_STATE=${LABKIT_STATE:-/var/lib/labkit}
mkdir -p "$(dirname "$LABKIT_LOG")" "$LABKIT_STATE"
exec > >(tee -a "$LABKIT_LOG") 2>&1
TEE_PID=$!
# Let the log catch up before the script ends, so that whoever waits for it reads every line.
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null || true' EXIT

STEP="start"
status() {
  printf '%s\n' "$*" >"$LABKIT_STATE/status"
}
step() {
  STEP="$1"
  echo "[labkit $(date -u +%H:%M:%S)] $1"
}
trap 'status "failed: $STEP (see $LABKIT_LOG)"; echo "[labkit] FAILED at: $STEP"' ERR

status "installing"
step "reading settings"
LABKIT_REPO=${LABKIT_REPO:-$(metadata labkit-repo)}
LABKIT_REF=${LABKIT_REF:-$(metadata labkit-ref)}
LABKIT_REF=${LABKIT_REF:-main}
LABKIT_MODE=${LABKIT_MODE:-$(metadata labkit-mode)}
if [[ -z "$LABKIT_MODE" ]]; then
  if has_tpu; then LABKIT_MODE=tpu; else LABKIT_MODE=cpu; fi
fi
LABKIT_HOME=${LABKIT_HOME:-/opt/labkit}
LABKIT_SMOKE_LAB=${LABKIT_SMOKE_LAB:-3}
LABKIT_SMOKE_TIMEOUT=${LABKIT_SMOKE_TIMEOUT:-300}
LABKIT_SYSTEM_PACKAGES=${LABKIT_SYSTEM_PACKAGES:-1}
LABKIT_DEP_GROUPS=${LABKIT_DEP_GROUPS:-notebook}
# On a multi-host TPU slice every worker runs this script on its own; JAX's multi-process start
# needs all workers in one run, which `workshop.sh run` does (--worker=all). Here each worker
# smokes the CPU configuration instead of waiting for its peers.
WORKERS=${LABKIT_WORKERS:-$(metadata worker-network-endpoints | tr ',' '\n' | grep -c . || true)}
echo "repo=$LABKIT_REPO ref=$LABKIT_REF mode=$LABKIT_MODE home=$LABKIT_HOME workers=${WORKERS:-0}"
if [[ -z "$LABKIT_REPO" ]]; then
  STEP="settings: LABKIT_REPO (metadata labkit-repo) is not set"
  false
fi
# The students' environment, as in the course image: the kit's dependencies and JupyterLab (the
# `notebook` group), without the kit's own dev, infra and lint tools.
case "$LABKIT_MODE" in
  tpu) SETUP_ARGS=(EXTRAS=tpu "DEP_GROUPS=$LABKIT_DEP_GROUPS"); SMOKE_CONFIG=tpu ;;
  cpu) SETUP_ARGS=("DEP_GROUPS=$LABKIT_DEP_GROUPS"); SMOKE_CONFIG=cpu-8 ;;
  *) STEP="settings: LABKIT_MODE must be tpu or cpu, not '$LABKIT_MODE'"; false ;;
esac
if [[ "$LABKIT_MODE" == tpu && "${WORKERS:-0}" -gt 1 ]]; then
  echo "multi-host slice of $WORKERS workers: the smoke lab runs on cpu-8 here; run the tpu lab on every worker with workshop.sh run"
  SMOKE_CONFIG=cpu-8
fi

if [[ "$LABKIT_SYSTEM_PACKAGES" != 0 ]] && command -v apt-get >/dev/null; then
  step "system packages (git, make, python3-venv)"
  missing=()
  for p in git make python3-venv ca-certificates curl; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

if [[ -d "$LABKIT_HOME/.git" ]]; then
  # A reboot (a Spot VM coming back, say): the students' files are in this checkout; leave it.
  step "kit already in $LABKIT_HOME: leaving the checkout and the students' files as they are"
else
  step "fetching the kit from $LABKIT_REPO at $LABKIT_REF"
  git clone --quiet "$LABKIT_REPO" "$LABKIT_HOME"
  git -C "$LABKIT_HOME" -c advice.detachedHead=false checkout --quiet "$LABKIT_REF"
fi
echo "kit at commit $(git -C "$LABKIT_HOME" rev-parse --short HEAD)"

step "installing the locked environment: make setup ${SETUP_ARGS[*]}"
# Python 3.11+ is required; where the image has an older python3 (Ubuntu 22.04 TPU images), uv
# fetches a managed interpreter for the environment. It goes beside the kit, not under root's
# home folder, which the students (other users) cannot enter.
export HOME=${HOME:-/root}
export UV_PYTHON_INSTALL_DIR=${UV_PYTHON_INSTALL_DIR:-$(dirname "$LABKIT_HOME")/labkit-python}
make -C "$LABKIT_HOME" setup "${SETUP_ARGS[@]}"

step "recording the environment's selection for every login: ${SETUP_ARGS[*]}"
# `make lab-N` installs again when it is asked for another selection than .venv has (see the
# Makefile); every login, ssh --command included, gets the one installed here, as the course image does.
ENV_FILE=${LABKIT_SYSTEM_ENV:-/etc/environment}
touch "$ENV_FILE"
sed -i -e '/^EXTRAS=/d' -e '/^DEP_GROUPS=/d' "$ENV_FILE"
printf 'EXTRAS=%s\nDEP_GROUPS=%s\n' "$([[ $LABKIT_MODE == tpu ]] && echo tpu)" "$LABKIT_DEP_GROUPS" >>"$ENV_FILE"

step "smoke lab: lab $LABKIT_SMOKE_LAB reference on $SMOKE_CONFIG"
(
  cd "$LABKIT_HOME"
  .venv/bin/python -m labkit lab "$LABKIT_SMOKE_LAB" --notebook "reference/lab-$LABKIT_SMOKE_LAB.ipynb" \
    --configs "$SMOKE_CONFIG" --timeout "$LABKIT_SMOKE_TIMEOUT"
)

step "opening the kit to the VM's users"
# Students log in with their own accounts (OS Login): they edit labs/ and write build/ and the
# grading folders; everything else is readable.
mkdir -p "$LABKIT_HOME/build" "$LABKIT_HOME/submissions" "$LABKIT_HOME/scoreboard"
chmod -R a+rX "$LABKIT_HOME"
if [[ -d "$UV_PYTHON_INSTALL_DIR" ]]; then chmod -R a+rX "$UV_PYTHON_INSTALL_DIR"; fi
chmod -R a+rwX "$LABKIT_HOME/labs" "$LABKIT_HOME/build" "$LABKIT_HOME/submissions" "$LABKIT_HOME/scoreboard"

status "ready: lab $LABKIT_SMOKE_LAB reference passed on $SMOKE_CONFIG ($(git -C "$LABKIT_HOME" rev-parse --short HEAD))"
step "ready"

#!/usr/bin/env bash
# Install the student release of the JAX SPMD lab kit on a workshop VM, check it with the smoke lab
# as a student gets it (every test of the unmodified lab reports "not implemented yet"), and start
# JupyterLab for the student.
#
# Terraform hands this file to every VM as its startup script, so it runs as root at every boot,
# on every worker of a TPU slice. It can also be run by hand, or locally in CPU mode:
#
#   LABKIT_REPO=/path/to/checkout LABKIT_HOME=/tmp/kit LABKIT_MODE=cpu LABKIT_SYSTEM_PACKAGES=0 \
#   LABKIT_LOG=/tmp/kit.log LABKIT_STATE=/tmp/kit-state LABKIT_USER=$(id -un) LABKIT_JUPYTER=background \
#   bash infra/startup.sh
#
# What the student's disk holds: the release (`python -m labkit release`: labkit/, labs/,
# tests/public/, Makefile, uv.lock, ...), never reference/ or tests/hidden/. The kit is cloned into a
# root-only staging folder, the release is built from it, and the clone is deleted.
#
# Settings come from the environment, or else from the VM's metadata (keys labkit-*, set by the
# Terraform modules):
#   LABKIT_REPO       https git URL (or local path) of the kit                (required)
#   LABKIT_REF        branch, tag or commit to check out                      (default: main)
#   LABKIT_MODE       tpu or cpu: `tpu` installs jax[tpu] (make setup EXTRAS=tpu) and smokes on tpu
#                     (default: tpu when the machine has TPU devices, else cpu)
#   LABKIT_HOME       where the student release goes                          (default: /opt/labkit)
#   LABKIT_LOG        the log a TA reads                                      (default: /var/log/labkit-startup.log)
#   LABKIT_STATE      the status file, the smoke copy, the staging clone      (default: /var/lib/labkit)
#   LABKIT_SMOKE_LAB  the lab whose unmodified notebook is the smoke test     (default: 3)
#   LABKIT_SMOKE_TIMEOUT  seconds the smoke notebook may run                  (default: 300)
#   LABKIT_SYSTEM_PACKAGES  0 skips apt-get (git, make, python3-venv)         (default: 1)
#   LABKIT_DEP_GROUPS the dependency groups of .venv (make setup DEP_GROUPS=...)  (default: notebook)
#   LABKIT_SYSTEM_ENV file that gives every login EXTRAS and DEP_GROUPS        (default: /etc/environment)
#   LABKIT_WORKERS    hosts in this TPU slice     (default: from the metadata key worker-network-endpoints)
#   LABKIT_USER       the account JupyterLab runs as and labs/ belongs to     (default: student, created)
#   LABKIT_JUPYTER    systemd, background or off: how JupyterLab is started   (default: systemd where it runs)
#   LABKIT_JUPYTER_PORT  its port, on 127.0.0.1 only (students tunnel to it)  (default: 8888)
#   LABKIT_STUDENT    the student's id, the name of their backups             (metadata labkit-student)
#   LABKIT_BACKUP     gs:// folder for labs/ backups; empty: none             (metadata labkit-backup)
#   LABKIT_IDLE_MINUTES  idle minutes before saving and stopping; 0: never    (metadata labkit-idle-minutes)
#
# A TA reads how it went with:
#   gcloud compute tpus tpu-vm ssh NAME --zone ZONE --tunnel-through-iap --command 'cat /var/lib/labkit/status'
# (`make workshop-status` does it for every VM). The status is `installing`, `ready: ...`,
# `idle: ...` or `failed: STEP (see LOG)`.
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
LABKIT_USER=${LABKIT_USER:-student}
LABKIT_JUPYTER_PORT=${LABKIT_JUPYTER_PORT:-8888}
if [[ -z "${LABKIT_JUPYTER:-}" ]]; then
  if [[ -d /run/systemd/system ]]; then LABKIT_JUPYTER=systemd; else LABKIT_JUPYTER=off; fi
fi
LABKIT_STUDENT=${LABKIT_STUDENT:-$(metadata labkit-student)}
LABKIT_STUDENT=${LABKIT_STUDENT:-$(hostname -s)}
LABKIT_BACKUP=${LABKIT_BACKUP-$(metadata labkit-backup)}
LABKIT_IDLE_MINUTES=${LABKIT_IDLE_MINUTES:-$(metadata labkit-idle-minutes)}
LABKIT_IDLE_MINUTES=${LABKIT_IDLE_MINUTES:-0}
SRC=$LABKIT_STATE/src
SMOKE_COPY=$LABKIT_STATE/smoke/lab-$LABKIT_SMOKE_LAB.ipynb
# On a multi-host TPU slice every worker runs this script on its own; JAX's multi-process start
# needs all workers in one run, which `workshop.sh run` does (--worker=all). Here each worker
# smokes the CPU configuration instead of waiting for its peers.
WORKERS=${LABKIT_WORKERS:-$(metadata worker-network-endpoints | tr ',' '\n' | grep -c . || true)}
echo "repo=$LABKIT_REPO ref=$LABKIT_REF mode=$LABKIT_MODE home=$LABKIT_HOME workers=${WORKERS:-0}" \
  "user=$LABKIT_USER student=$LABKIT_STUDENT backup=${LABKIT_BACKUP:-none} idle=${LABKIT_IDLE_MINUTES}min"
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
    # At first boot the image's own updates may hold the apt lock: wait for it (up to 10 minutes).
    apt_get=(apt-get -o DPkg::Lock::Timeout=600 -qq)
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" update
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends "${missing[@]}"
  fi
fi

# Python 3.11+ is required; where the image has an older python3 (Ubuntu 22.04 TPU images), uv
# fetches a managed interpreter for the environment. It goes beside the kit, not under root's
# home folder, which the students (other users) cannot enter.
export HOME=${HOME:-/root}
export UV_PYTHON_INSTALL_DIR=${UV_PYTHON_INSTALL_DIR:-$(dirname "$LABKIT_HOME")/labkit-python}

if [[ -f "$LABKIT_HOME/.labkit-release" ]]; then
  # A reboot (a CPU VM started again): the student's files are in this release; leave them.
  step "student release already in $LABKIT_HOME: leaving it and the student's files as they are"
else
  step "fetching the kit from $LABKIT_REPO at $LABKIT_REF (into a root-only staging folder)"
  rm -rf "$SRC"
  install -d -m 0700 "$SRC"
  git clone --quiet "$LABKIT_REPO" "$SRC"
  git -C "$SRC" -c advice.detachedHead=false checkout --quiet "$LABKIT_REF"
  step "building the student release (no reference/, no tests/hidden/)"
  make -C "$SRC" setup "DEP_GROUPS=$LABKIT_DEP_GROUPS"
  "$SRC/.venv/bin/python" -m labkit release --out "$SRC/build/student-release"
  mkdir -p "$LABKIT_HOME"
  cp -a "$SRC/build/student-release/." "$LABKIT_HOME/"
  git -C "$SRC" rev-parse --short HEAD >"$LABKIT_HOME/.labkit-commit"
  rm -rf "$SRC"
  # The smoke check runs on the lab as shipped, whatever the student does to labs/ later.
  mkdir -p "$(dirname "$SMOKE_COPY")"
  cp "$LABKIT_HOME/labs/$(basename "$SMOKE_COPY")" "$SMOKE_COPY"
  if [[ -n "$LABKIT_BACKUP" ]]; then
    # A VM made again (a preempted Spot TPU VM is deleted and recreated): the student's last backup.
    step "restoring labs/ from $LABKIT_BACKUP/$LABKIT_STUDENT, if there is a backup"
    if gcloud storage ls "$LABKIT_BACKUP/$LABKIT_STUDENT/" >/dev/null 2>&1; then
      gcloud storage rsync --recursive "$LABKIT_BACKUP/$LABKIT_STUDENT" "$LABKIT_HOME/labs"
      echo "restored labs/ from $LABKIT_BACKUP/$LABKIT_STUDENT"
    else
      echo "no backup yet: a new VM"
    fi
  fi
fi
echo "kit at commit $(cat "$LABKIT_HOME/.labkit-commit")"
for forbidden in reference tests/hidden; do
  if [[ -e "$LABKIT_HOME/$forbidden" ]]; then
    STEP="the student release holds $forbidden"
    false
  fi
done

step "installing the locked environment: make setup ${SETUP_ARGS[*]}"
make -C "$LABKIT_HOME" setup "${SETUP_ARGS[@]}"

step "recording the environment's selection for every login: ${SETUP_ARGS[*]}"
# `make lab-N` installs again when it is asked for another selection than .venv has (see the
# Makefile); every login, ssh --command included, gets the one installed here, as the course image does.
ENV_FILE=${LABKIT_SYSTEM_ENV:-/etc/environment}
touch "$ENV_FILE"
sed -i -e '/^EXTRAS=/d' -e '/^DEP_GROUPS=/d' "$ENV_FILE"
printf 'EXTRAS=%s\nDEP_GROUPS=%s\n' "$([[ $LABKIT_MODE == tpu ]] && echo tpu)" "$LABKIT_DEP_GROUPS" >>"$ENV_FILE"

step "smoke lab: lab $LABKIT_SMOKE_LAB as shipped on $SMOKE_CONFIG (every test should say: not implemented yet)"
SMOKE_BUILD=$LABKIT_STATE/smoke/build
rm -rf "$SMOKE_BUILD"
(
  cd "$LABKIT_HOME"
  LABKIT_BUILD=$SMOKE_BUILD .venv/bin/python -m labkit lab "$LABKIT_SMOKE_LAB" --notebook "$SMOKE_COPY" \
    --configs "$SMOKE_CONFIG" --timeout "$LABKIT_SMOKE_TIMEOUT" || true
)
SMOKE=$("$LABKIT_HOME/.venv/bin/python" - "$SMOKE_BUILD/lab-$LABKIT_SMOKE_LAB/report.json" <<'EOF'
import json, sys
try:
    outcomes = json.load(open(sys.argv[1]))["outcomes"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"no report ({e})")
statuses = sorted({o["status"] for o in outcomes})
if outcomes and statuses == ["todo"]:
    print(f"{len(outcomes)} tests, every one not implemented yet")
else:
    sys.exit(f"expected every test to be 'not implemented yet', got {statuses or 'no tests'}")
EOF
) || {
  STEP="smoke lab: lab $LABKIT_SMOKE_LAB as shipped on $SMOKE_CONFIG"
  false
}
echo "smoke lab: $SMOKE"

step "handing labs/ to $LABKIT_USER"
if ! id -u "$LABKIT_USER" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash "$LABKIT_USER"
fi
mkdir -p "$LABKIT_HOME/build"
# The release and its environment stay root's and read-only; the student owns labs/ and build/.
chmod -R go-w "$LABKIT_HOME"
chmod -R a+rX "$LABKIT_HOME"
if [[ -d "$UV_PYTHON_INSTALL_DIR" ]]; then chmod -R a+rX "$UV_PYTHON_INSTALL_DIR"; fi
chown -R "$LABKIT_USER:" "$LABKIT_HOME/labs" "$LABKIT_HOME/build"
if [[ "$LABKIT_MODE" == tpu ]]; then
  # The VM is the student's: their JupyterLab and `make lab-N` open the TPU chips as $LABKIT_USER.
  # (Device nodes are made again at every boot, and so is this.)
  for chip in /dev/accel* /dev/vfio/[0-9]*; do
    [[ -e "$chip" ]] || continue
    chgrp "$(id -gn "$LABKIT_USER")" "$chip" && chmod g+rw "$chip"
  done
fi
chmod 0700 "$LABKIT_STATE/smoke" 2>/dev/null || true

# The helpers the timers run: backup of labs/, and the idle check.
step "installing labkit-backup and labkit-idle"
cat >"$LABKIT_STATE/labkit-backup" <<EOF
#!/usr/bin/env bash
# Copy labs/ to the workshop bucket (written by startup.sh; run every 5 minutes by labkit-backup.timer).
set -euo pipefail
[[ -n "$LABKIT_BACKUP" ]] || exit 0
gcloud storage rsync --recursive --exclude '.*\.ipynb_checkpoints.*' "$LABKIT_HOME/labs" "$LABKIT_BACKUP/$LABKIT_STUDENT"
date -u +%FT%TZ >"$LABKIT_STATE/last-backup"
EOF
cat >"$LABKIT_STATE/labkit-idle" <<EOF
#!/usr/bin/env bash
# After $LABKIT_IDLE_MINUTES minutes with no login and no kernel activity: save labs/, then stop a CPU
# VM, or mark a TPU VM idle for \`workshop.sh idle\` to delete (its account may not delete it).
set -euo pipefail
limit=$LABKIT_IDLE_MINUTES
((limit > 0)) || exit 0
if [[ -n "\$(who)" ]]; then exit 0; fi
last=\$(curl -fsS --max-time 5 "http://127.0.0.1:$LABKIT_JUPYTER_PORT/api/status" 2>/dev/null \\
  | "$LABKIT_HOME/.venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["last_activity"])' 2>/dev/null || true)
since=\$(date -d "\${last:-@0}" +%s 2>/dev/null || echo 0)
boot=\$(date -d "\$(uptime -s)" +%s)
((since > boot)) || since=\$boot
if ((\$(date +%s) - since < limit * 60)); then exit 0; fi
"$LABKIT_STATE/labkit-backup"
if [[ "$LABKIT_MODE" == cpu ]]; then
  echo "idle: stopped after \$limit idle minutes, labs/ saved \$(date -u +%H:%M)" >"$LABKIT_STATE/status"
  systemctl poweroff
else
  echo "idle: \$limit minutes without use, labs/ saved \$(date -u +%H:%M); workshop.sh idle deletes it" >"$LABKIT_STATE/status"
fi
EOF
chmod 0755 "$LABKIT_STATE/labkit-backup" "$LABKIT_STATE/labkit-idle"

if [[ "$LABKIT_JUPYTER" == systemd ]]; then
  step "systemd units: labkit-jupyter, labkit-backup.timer, labkit-idle.timer"
  cat >/etc/systemd/system/labkit-jupyter.service <<EOF
[Unit]
Description=JupyterLab for the lab kit, as $LABKIT_USER, on 127.0.0.1:$LABKIT_JUPYTER_PORT (reached through an IAP ssh tunnel)
After=network-online.target

[Service]
User=$LABKIT_USER
WorkingDirectory=$LABKIT_HOME
EnvironmentFile=$ENV_FILE
ExecStart=$LABKIT_HOME/.venv/bin/jupyter lab --ip=127.0.0.1 --port=$LABKIT_JUPYTER_PORT --no-browser --IdentityProvider.token= --ServerApp.password= --ServerApp.root_dir=$LABKIT_HOME
Restart=always

[Install]
WantedBy=multi-user.target
EOF
  for unit in backup idle; do
    printf '[Unit]\nDescription=labkit-%s\n\n[Service]\nType=oneshot\nExecStart=%s\n' "$unit" "$LABKIT_STATE/labkit-$unit" \
      >"/etc/systemd/system/labkit-$unit.service"
    printf '[Unit]\nDescription=labkit-%s every 5 minutes\n\n[Timer]\nOnBootSec=5min\nOnUnitActiveSec=5min\n\n[Install]\nWantedBy=timers.target\n' \
      "$unit" >"/etc/systemd/system/labkit-$unit.timer"
  done
  systemctl daemon-reload
  systemctl enable --now labkit-jupyter.service labkit-backup.timer labkit-idle.timer
elif [[ "$LABKIT_JUPYTER" == background ]]; then
  # For a run by hand (and the kit's tests): JupyterLab in the background, its own process group.
  step "JupyterLab in the background"
  (
    cd "$LABKIT_HOME"
    # (Run by hand as root, JupyterLab asks for --allow-root.)
    as_root=()
    [[ $(id -u) != 0 ]] || as_root=(--allow-root)
    setsid .venv/bin/jupyter lab --ip=127.0.0.1 --port="$LABKIT_JUPYTER_PORT" --no-browser --IdentityProvider.token= \
      --ServerApp.password= --ServerApp.root_dir="$LABKIT_HOME" "${as_root[@]}" \
      </dev/null >"$LABKIT_STATE/jupyter.log" 2>&1 &
    echo $! >"$LABKIT_STATE/jupyter.pid"
  )
fi
if [[ "$LABKIT_JUPYTER" != off ]]; then
  step "waiting for JupyterLab to answer on 127.0.0.1:$LABKIT_JUPYTER_PORT"
  for _ in $(seq 120); do
    curl -fsS --max-time 2 "http://127.0.0.1:$LABKIT_JUPYTER_PORT/api/status" >/dev/null 2>&1 && break
    sleep 1
  done
  curl -fsS --max-time 5 "http://127.0.0.1:$LABKIT_JUPYTER_PORT/api/status" >/dev/null
  JUPYTER=", JupyterLab on 127.0.0.1:$LABKIT_JUPYTER_PORT"
fi

status "ready: lab $LABKIT_SMOKE_LAB as shipped reports not implemented yet on $SMOKE_CONFIG$([[ -z ${JUPYTER:-} ]] || echo "$JUPYTER") ($(cat "$LABKIT_HOME/.labkit-commit"))"
step "ready"

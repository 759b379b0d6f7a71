#!/usr/bin/env bash
# The workshop's front door: start the VMs, watch them, run a lab or the grade on all of them,
# bring the work back into one scoreboard, and tear everything down.
#
#   infra/workshop.sh up [--yes]                 print the cost per hour, then terraform apply
#   infra/workshop.sh cost                       only print the cost per hour
#   infra/workshop.sh status                     the VMs, their state, and each one's kit status
#   infra/workshop.sh run lab N [--configs C]    run `make lab-N` on every VM (every worker of a slice)
#   infra/workshop.sh run grade [ARGS...]        grade each VM's own notebooks there (nox -s grade -- ARGS)
#   infra/workshop.sh collect [DIR]              copy notebooks and results back, merge one scoreboard
#   infra/workshop.sh down [--yes]               terraform destroy, then check nothing labelled is left
#
# The make targets workshop-up, workshop-status, workshop-run, workshop-collect and workshop-down
# call it. Settings come from the tfvars file (WORKSHOP_TFVARS, default infra/workshop.tfvars; copy
# infra/workshop.tfvars.example): the script reads its simple `name = value` lines (project,
# workshop, zone, tpu_count, accelerator_type, spot, preemptible, cpu_count, cpu_zone,
# machine_type) and hands the whole file to terraform.
set -euo pipefail

INFRA=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$INFRA")
TFVARS=${WORKSHOP_TFVARS:-$INFRA/workshop.tfvars}
[[ "$TFVARS" == /* ]] || TFVARS=$PWD/$TFVARS # terraform runs in infra/: hand it an absolute path
PRICES=${WORKSHOP_PRICES:-$INFRA/prices.tsv}
KIT_HOME=/opt/labkit # where startup.sh installs the kit on every VM
LOGS=${WORKSHOP_LOGS:-$ROOT/build/workshop}
NOX=${LABKIT_NOX:-$ROOT/.venv/bin/nox}

die() {
  echo "workshop: $*" >&2
  exit 2
}

usage() {
  sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# The value of a simple `name = value` line of the tfvars file (quotes removed), or $2.
tfvar() {
  local value
  value=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"?([^\"#]*)\"?.*$/\1/p" "$TFVARS" | tail -n 1)
  value=${value%"${value##*[![:space:]]}"}
  echo "${value:-${2:-}}"
}

load_settings() {
  [[ -f "$TFVARS" ]] || die "no settings at $TFVARS: copy infra/workshop.tfvars.example there and edit it"
  PROJECT=$(tfvar project)
  WORKSHOP=$(tfvar workshop)
  ZONE=$(tfvar zone us-central1-a)
  CPU_ZONE=$(tfvar cpu_zone "$ZONE")
  [[ "$CPU_ZONE" == null ]] && CPU_ZONE=$ZONE
  TPU_COUNT=$(tfvar tpu_count 1)
  CPU_COUNT=$(tfvar cpu_count 0)
  ACCELERATOR=$(tfvar accelerator_type v5litepod-8)
  MACHINE=$(tfvar machine_type e2-standard-4)
  SPOT=$(tfvar spot false)
  PREEMPTIBLE=$(tfvar preemptible false)
  [[ -n "$PROJECT" ]] || die "$TFVARS sets no project"
  [[ -n "$WORKSHOP" ]] || die "$TFVARS sets no workshop name"
}

confirm() {
  local answer=""
  if [[ "${YES:-0}" == 1 || "${WORKSHOP_YES:-0}" == 1 ]]; then return 0; fi
  read -r -p "$1 [y/N] " answer || true
  [[ "$answer" == y || "$answer" == yes ]] || die "stopped: nothing was changed"
}

# price TYPE -> dollars per hour of one VM, or nothing when the table does not know the type.
price() {
  awk -F '\t' -v t="$1" '$1 == t { print $2 }' "$PRICES"
}
hosts() {
  awk -F '\t' -v t="$1" '$1 == t { print $3 }' "$PRICES"
}

# What `up` is about to start and what it costs per hour.
print_cost() {
  local tpu_price cpu_price total kind="on-demand" bound="" estimated
  estimated=$(sed -n -E 's/.*written down on ([0-9-]+).*/\1/p' "$PRICES" | head -n 1)
  if [[ "$SPOT" == true || "$PREEMPTIBLE" == true ]]; then
    kind="spot/preemptible"
    bound="at most "
  fi
  tpu_price=$(price "$ACCELERATOR")
  cpu_price=$(price "$MACHINE")
  echo "Workshop $WORKSHOP in project $PROJECT is about to start:"
  if ((TPU_COUNT > 0)); then
    if [[ -n "$tpu_price" ]]; then
      printf '  %3d x %-14s TPU VM (%s, %s host(s) each) at %s$%.2f/h = $%.2f/h\n' "$TPU_COUNT" "$ACCELERATOR" \
        "$kind" "$(hosts "$ACCELERATOR")" "$bound" "$tpu_price" "$(awk -v n="$TPU_COUNT" -v p="$tpu_price" 'BEGIN { print n * p }')"
    else
      printf '  %3d x %-14s TPU VM: no price known for this type; see https://cloud.google.com/tpu/pricing\n' "$TPU_COUNT" "$ACCELERATOR"
    fi
  fi
  if ((CPU_COUNT > 0)); then
    if [[ -n "$cpu_price" ]]; then
      printf '  %3d x %-14s CPU VM (%s) at %s$%.3f/h = $%.2f/h\n' "$CPU_COUNT" "$MACHINE" "$kind" "$bound" "$cpu_price" \
        "$(awk -v n="$CPU_COUNT" -v p="$cpu_price" 'BEGIN { print n * p }')"
    else
      printf '  %3d x %-14s CPU VM: no price known for this type; see https://cloud.google.com/compute/vm-instance-pricing\n' "$CPU_COUNT" "$MACHINE"
    fi
  fi
  total=$(awk -v a="$TPU_COUNT" -v p="${tpu_price:-0}" -v b="$CPU_COUNT" -v q="${cpu_price:-0}" 'BEGIN { printf "%.2f", a * p + b * q }')
  echo "Estimated cost: ${bound}\$$total per hour while they run (\$$(awk -v t="$total" 'BEGIN { printf "%.0f", 8 * t }') for an 8-hour day)."
  echo "An estimate from $PRICES (list prices written down on ${estimated:-an unknown date}), not a quote: check the pricing pages."
}

terraform_apply_or_destroy() {
  terraform -chdir="$INFRA" init -input=false
  terraform -chdir="$INFRA" "$1" -input=false -auto-approve -var-file="$TFVARS"
}

# Names from `terraform output -json NAME` (a JSON list), one a line.
output_list() {
  terraform -chdir="$INFRA" output -json "$1" | python3 -c 'import json, sys; sys.stdout.writelines(n + "\n" for n in json.load(sys.stdin) or [])'
}

# The VM names, into the arrays TPUS and CPUS. Loops go over these arrays, never over a
# `while read` of a pipe: ssh reads standard input and would swallow the rest of the list.
load_names() {
  mapfile -t TPUS < <(output_list tpu_names)
  mapfile -t CPUS < <(output_list cpu_names)
}

# Run a command on one VM: every worker of a TPU slice (JAX multi-process needs all of them in
# the same run), or the one CPU VM.
on_tpu() {
  local name=$1
  shift
  gcloud compute tpus tpu-vm ssh "$name" --project "$PROJECT" --zone "$ZONE" --worker=all --command "$*"
}
on_cpu() {
  local name=$1
  shift
  gcloud compute ssh "$name" --project "$PROJECT" --zone "$CPU_ZONE" --command "$*"
}

cmd_up() {
  load_settings
  print_cost
  confirm "Start them?"
  terraform_apply_or_destroy apply
  echo
  echo "Started. One ssh command per VM (hand each student theirs):"
  output_list ssh_commands | sed 's/^/  /'
  echo "Each VM installs the kit and runs a smoke lab (a few minutes); watch with: make workshop-status"
}

cmd_cost() {
  load_settings
  print_cost
}

cmd_status() {
  load_settings
  echo "== TPU VMs labelled workshop=$WORKSHOP in $ZONE"
  gcloud compute tpus tpu-vm list --project "$PROJECT" --zone "$ZONE" --filter "labels.workshop=$WORKSHOP" \
    --format "table(name.basename(),state,acceleratorType.basename(),health)"
  echo "== CPU VMs labelled workshop=$WORKSHOP"
  gcloud compute instances list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" \
    --format "table(name,zone.basename(),status)"
  echo "== the kit on each VM ($KIT_HOME; 'ready: ...' once its smoke lab passed)"
  local name
  load_names
  for name in "${TPUS[@]}"; do
    echo "-- $name"
    on_tpu "$name" "cat /var/lib/labkit/status 2>/dev/null || echo 'no status yet: still booting'" || echo "unreachable"
  done
  for name in "${CPUS[@]}"; do
    echo "-- $name"
    on_cpu "$name" "cat /var/lib/labkit/status 2>/dev/null || echo 'no status yet: still booting'" || echo "unreachable"
  done
}

# run lab N [--configs C] | run grade [ARGS...]: on every VM at once, one log per VM.
cmd_run() {
  load_settings
  local what=${1:-} tpu_cmd cpu_cmd lab configs="" name pids=() names=() failed=0 i
  shift || true
  case "$what" in
    lab)
      lab=${1:-}
      [[ "$lab" =~ ^[0-9]+$ ]] || die "usage: workshop.sh run lab N [--configs C]"
      shift
      if [[ "${1:-}" == --configs ]]; then configs=${2:?--configs needs a value}; fi
      # On a slice of several hosts every worker runs the lab and they join as one JAX program.
      tpu_cmd="cd $KIT_HOME && LABKIT_TPU_HOSTS=$(hosts "$ACCELERATOR") make lab-$lab CONFIGS=${configs:-tpu}"
      cpu_cmd="cd $KIT_HOME && make lab-$lab CONFIGS=${configs:-cpu-1,cpu-8}"
      ;;
    grade)
      # Each VM is one student (or team): its labs/ become submissions/<vm name>/ and are graded there.
      local extra=""
      (($#)) && extra=$(printf ' %q' "$@")
      tpu_cmd="cd $KIT_HOME && rm -rf submissions/\$(hostname -s) && mkdir -p submissions/\$(hostname -s) && cp labs/lab-*.ipynb submissions/\$(hostname -s)/ && .venv/bin/nox -s grade -- --submissions submissions --out scoreboard$extra"
      cpu_cmd=$tpu_cmd
      ;;
    *) die "usage: workshop.sh run lab N [--configs C] | run grade [ARGS...]" ;;
  esac
  mkdir -p "$LOGS"
  load_names
  for name in "${TPUS[@]}"; do
    on_tpu "$name" "$tpu_cmd" >"$LOGS/$name.log" 2>&1 </dev/null &
    pids+=($!)
    names+=("$name")
  done
  for name in "${CPUS[@]}"; do
    on_cpu "$name" "$cpu_cmd" >"$LOGS/$name.log" 2>&1 </dev/null &
    pids+=($!)
    names+=("$name")
  done
  ((${#pids[@]})) || die "no VMs: run \`make workshop-up\` first"
  echo "running '$what${lab:+ $lab}' on ${#pids[@]} VM(s); logs in $LOGS/"
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      echo "  ${names[$i]}: ok"
    else
      echo "  ${names[$i]}: exit $? (see $LOGS/${names[$i]}.log)"
      failed=1
    fi
  done
  return "$failed"
}

# collect [DIR]: each VM's labs/ and scoreboard/ into DIR/vms/<vm>/, its notebooks into
# DIR/submissions/<vm>/ (ready for `nox -s grade -- --submissions DIR/submissions`), and the
# VMs' scoreboards merged into DIR/scoreboard/.
cmd_collect() {
  load_settings
  local out=${1:-$ROOT/build/workshop-results} name parts=() n=0
  mkdir -p "$out/vms" "$out/submissions"
  load_names
  for name in "${TPUS[@]}"; do
    mkdir -p "$out/vms/$name"
    gcloud compute tpus tpu-vm scp --project "$PROJECT" --zone "$ZONE" --worker=0 --recurse \
      "$name:$KIT_HOME/labs" "$out/vms/$name/" || echo "  $name: its notebooks could not be copied"
    gcloud compute tpus tpu-vm scp --project "$PROJECT" --zone "$ZONE" --worker=0 --recurse \
      "$name:$KIT_HOME/scoreboard" "$out/vms/$name/" || echo "  $name: no results there (not graded yet?)"
    n=$((n + 1))
  done
  for name in "${CPUS[@]}"; do
    mkdir -p "$out/vms/$name"
    gcloud compute scp --project "$PROJECT" --zone "$CPU_ZONE" --recurse \
      "$name:$KIT_HOME/labs" "$out/vms/$name/" || echo "  $name: its notebooks could not be copied"
    gcloud compute scp --project "$PROJECT" --zone "$CPU_ZONE" --recurse \
      "$name:$KIT_HOME/scoreboard" "$out/vms/$name/" || echo "  $name: no results there (not graded yet?)"
    n=$((n + 1))
  done
  ((n)) || die "no VMs: run \`make workshop-up\` first"
  for name in "$out"/vms/*/; do
    name=$(basename "$name")
    if compgen -G "$out/vms/$name/labs/lab-*.ipynb" >/dev/null; then
      mkdir -p "$out/submissions/$name"
      cp "$out/vms/$name"/labs/lab-*.ipynb "$out/submissions/$name/"
    fi
    [[ -f "$out/vms/$name/scoreboard/scoreboard.csv" ]] && parts+=("$out/vms/$name/scoreboard")
  done
  echo "notebooks of $(find "$out/submissions" -mindepth 1 -maxdepth 1 -type d | wc -l) VM(s) in $out/submissions/"
  if ((${#parts[@]} == 0)); then
    echo "no VM has graded results yet (run \`make workshop-run ARGS=grade\` first); nothing to merge"
    return 0
  fi
  "$NOX" -f "$ROOT/noxfile.py" -s scoreboard -- merge "${parts[@]}" --out "$out/scoreboard"
  echo "merged ${#parts[@]} scoreboard(s) into $out/scoreboard/"
}

cmd_down() {
  load_settings
  confirm "Destroy every VM of workshop $WORKSHOP in project $PROJECT?"
  terraform_apply_or_destroy destroy
  echo "checking that nothing labelled workshop=$WORKSHOP is left..."
  local left name
  left=$(
    gcloud compute tpus tpu-vm list --project "$PROJECT" --zone "$ZONE" --filter "labels.workshop=$WORKSHOP" --format "value(name)"
    gcloud compute instances list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" --format "value(name)"
    gcloud compute disks list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" --format "value(name)"
  )
  if [[ -n "${left//[[:space:]]/}" ]]; then
    echo "STILL THERE (and still billed), labelled workshop=$WORKSHOP:" >&2
    grep . <<<"$left" | while read -r name; do echo "  $name"; done >&2
    echo "delete them in the console or with gcloud (compute tpus tpu-vm delete / compute instances delete / compute disks delete)" >&2
    return 1
  fi
  echo "nothing labelled workshop=$WORKSHOP is left in $PROJECT"
}

main() {
  local args=() a
  YES=0
  for a in "$@"; do
    if [[ "$a" == --yes || "$a" == -y ]]; then YES=1; else args+=("$a"); fi
  done
  set -- "${args[@]+"${args[@]}"}"
  local cmd=${1:-help}
  shift || true
  case "$cmd" in
    up) cmd_up "$@" ;;
    cost) cmd_cost "$@" ;;
    status) cmd_status "$@" ;;
    run) cmd_run "$@" ;;
    collect) cmd_collect "$@" ;;
    down) cmd_down "$@" ;;
    help | -h | --help) usage ;;
    *)
      usage >&2
      exit 2
      ;;
  esac
}

main "$@"

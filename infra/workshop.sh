#!/usr/bin/env bash
# The workshop's front door: start the VMs, hand each student the link to theirs, watch them, run a
# lab on all of them, bring the work back and grade it here, and tear everything down.
#
#   infra/workshop.sh up [--yes]                 check the settings, print the cost, terraform apply
#   infra/workshop.sh cost                       only check the settings and print the cost
#   infra/workshop.sh links                      per student: the command that opens their JupyterLab
#   infra/workshop.sh status                     the VMs, their state (preempted ones too), each kit's status
#   infra/workshop.sh run lab N [--configs C]    run `make lab-N` on every VM (every worker of a slice)
#   infra/workshop.sh collect [DIR]              copy every VM's notebooks back, by student
#   infra/workshop.sh grade [ARGS...]            collect, then grade here with the hidden tests (nox -s grade -- ARGS)
#   infra/workshop.sh idle [--yes]               delete the TPU VMs that saved their work and went idle
#   infra/workshop.sh down [--yes] [--force]     terraform destroy, then list whatever labelled is left
#
# The make targets workshop-up, -links, -status, -run, -collect, -grade, -idle and -down call it.
# Settings come from the tfvars file (WORKSHOP_TFVARS, default infra/workshop.tfvars; copy
# infra/workshop.tfvars.example): the script reads its simple `name = value` lines and hands the
# whole file to terraform.
# Not `set -e`: `up` and `down` must go on after a failed step to say what exists; every step that
# must stop the script checks its own status.
set -uo pipefail

INFRA=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$INFRA")
TFVARS=${WORKSHOP_TFVARS:-$INFRA/workshop.tfvars}
[[ "$TFVARS" == /* ]] || TFVARS=$PWD/$TFVARS # terraform runs in infra/: hand it an absolute path
PRICES=${WORKSHOP_PRICES:-$INFRA/prices.tsv}
TYPES=${WORKSHOP_TPU_TYPES:-$INFRA/tpu-types.tsv}
KIT_HOME=/opt/labkit # where startup.sh installs the student release on every VM
LOGS=${WORKSHOP_LOGS:-$ROOT/build/workshop}
NOX=${LABKIT_NOX:-$ROOT/.venv/bin/nox}
JUPYTER_PORT=8888

die() {
  echo "workshop: $*" >&2
  exit 2
}

usage() {
  sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# The value of a simple `name = value` line of the tfvars file (quotes removed), or $2.
tfvar() {
  local value
  value=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"?([^\"#]*)\"?.*$/\1/p" "$TFVARS" | tail -n 1)
  value=${value%"${value##*[![:space:]]}"}
  [[ "$value" == null ]] && value=""
  echo "${value:-${2:-}}"
}

load_settings() {
  [[ -f "$TFVARS" ]] || die "no settings at $TFVARS: copy infra/workshop.tfvars.example there and edit it"
  PROJECT=$(tfvar project)
  WORKSHOP=$(tfvar workshop)
  ZONE=$(tfvar zone us-central1-a)
  CPU_ZONE=$(tfvar cpu_zone "$ZONE")
  TPU_COUNT=$(tfvar tpu_count 1)
  CPU_COUNT=$(tfvar cpu_count 0)
  ACCELERATOR=$(tfvar accelerator_type v5litepod-8)
  RUNTIME=$(tfvar runtime_version v2-alpha-tpuv5-lite)
  MACHINE=$(tfvar machine_type e2-standard-4)
  SPOT=$(tfvar spot false)
  PREEMPTIBLE=$(tfvar preemptible false)
  HOURS=$(tfvar hours 8)
  USD_PER_HOUR=$(tfvar usd_per_hour)
  ROSTER=$(tfvar roster)
  QUEUED=$(tfvar queued_resources false)
  [[ -n "$PROJECT" ]] || die "$TFVARS sets no project"
  [[ -n "$WORKSHOP" ]] || die "$TFVARS sets no workshop name"
  if [[ -n "$ROSTER" ]]; then
    [[ "$ROSTER" == /* ]] || ROSTER=$INFRA/$ROSTER # as terraform reads it, from infra/
    [[ -f "$ROSTER" ]] || die "the roster $ROSTER does not exist"
    # One VM per row: kind tpu (the default) or cpu.
    TPU_COUNT=$(roster_count tpu)
    CPU_COUNT=$(roster_count cpu)
  fi
  COLLECTED=$LOGS/$WORKSHOP.collected
}

roster_count() {
  awk -F, -v want="$1" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    NF { kind = ("kind" in col) ? $col["kind"] : ""; gsub(/[[:space:]]/, "", kind); if (kind == "") kind = "tpu"
         if (kind == want) n++ } END { print n + 0 }' "$ROSTER"
}

confirm() {
  local answer=""
  if [[ "${YES:-0}" == 1 || "${WORKSHOP_YES:-0}" == 1 ]]; then return 0; fi
  read -r -p "$1 [y/N] " answer || true
  [[ "$answer" == y || "$answer" == yes ]] || die "stopped: nothing was changed"
}

# accelerator_type, runtime_version and zone, together, against the kit's table (tpu-types.tsv).
validate() {
  ((TPU_COUNT > 0)) || return 0
  local generation row runtimes zones
  [[ "$ACCELERATOR" =~ ^([a-z0-9]+)-[0-9]+$ ]] || die "accelerator_type $ACCELERATOR is not a Cloud TPU type such as v5litepod-8"
  generation=${BASH_REMATCH[1]}
  row=$(awk -F '\t' -v g="$generation" '!/^#/ && $1 == g' "$TYPES")
  [[ -n "$row" ]] || die "accelerator_type $ACCELERATOR: the generation $generation is not in $TYPES (known: $(awk -F '\t' '!/^#/ { printf "%s ", $1 }' "$TYPES"))"
  runtimes=$(cut -f2 <<<"$row")
  zones=$(cut -f3 <<<"$row")
  if [[ ",$runtimes," != *",$RUNTIME,"* ]]; then
    die "runtime_version $RUNTIME does not run $generation; use ${runtimes//,/ or } (Cloud TPU's documentation, as written down in $TYPES)"
  fi
  if [[ ",$zones," != *",$ZONE,"* ]]; then
    die "zone $ZONE does not offer $generation according to $TYPES; its zones: ${zones//,/, }. If Google added it, check with \`gcloud compute tpus accelerator-types list --zone $ZONE\` and add it to the table"
  fi
}

# price TYPE -> dollars per hour of one VM, or nothing when the table does not know the type.
price() {
  awk -F '\t' -v t="$1" '$1 == t { print $2 }' "$PRICES"
}

# What `up` is about to start and what it costs, per hour and for the planned hours. A type with
# no price in the table stops here, unless the settings give one (usd_per_hour).
print_cost() {
  local tpu_price cpu_price total kind="on-demand" bound="" estimated source
  estimated=$(sed -n -E 's/.*written down on ([0-9-]+).*/\1/p' "$PRICES" | head -n 1)
  if [[ "$SPOT" == true || "$PREEMPTIBLE" == true ]]; then
    kind="spot/preemptible"
    bound="at most "
  fi
  tpu_price=$(price "$ACCELERATOR")
  source="from $PRICES"
  if [[ -n "$USD_PER_HOUR" ]]; then
    tpu_price=$USD_PER_HOUR
    source="as given by usd_per_hour"
  fi
  cpu_price=$(price "$MACHINE")
  if ((TPU_COUNT > 0)) && [[ -z "$tpu_price" ]]; then
    die "no price known for $ACCELERATOR in $PRICES: set usd_per_hour = <dollars per VM per hour> in $TFVARS (see https://cloud.google.com/tpu/pricing); nothing was started"
  fi
  if ((CPU_COUNT > 0)) && [[ -z "$cpu_price" ]]; then
    die "no price known for $MACHINE in $PRICES: add a line for it (see https://cloud.google.com/compute/vm-instance-pricing); nothing was started"
  fi
  echo "Workshop $WORKSHOP in project $PROJECT is about to start:"
  if ((TPU_COUNT > 0)); then
    printf '  %3d x %-14s TPU VM (%s, %s) at %s$%.2f/h = $%.2f/h\n' "$TPU_COUNT" "$ACCELERATOR" "$kind" "$source" \
      "$bound" "$tpu_price" "$(awk -v n="$TPU_COUNT" -v p="$tpu_price" 'BEGIN { print n * p }')"
  fi
  if ((CPU_COUNT > 0)); then
    printf '  %3d x %-14s CPU VM (%s) at %s$%.3f/h = $%.2f/h\n' "$CPU_COUNT" "$MACHINE" "$kind" "$bound" "$cpu_price" \
      "$(awk -v n="$CPU_COUNT" -v p="$cpu_price" 'BEGIN { print n * p }')"
  fi
  total=$(awk -v a="$TPU_COUNT" -v p="${tpu_price:-0}" -v b="$CPU_COUNT" -v q="${cpu_price:-0}" 'BEGIN { printf "%.2f", a * p + b * q }')
  echo "Estimated cost: ${bound}\$$total per hour while they run, ${bound}\$$(awk -v t="$total" -v h="$HOURS" 'BEGIN { printf "%.2f", t * h }') for the planned $HOURS hours."
  echo "An estimate from $PRICES (list prices written down on ${estimated:-an unknown date}), not a quote: check the pricing pages."
}

tf() {
  terraform -chdir="$INFRA" "$@"
}

# Names from `terraform output -json NAME` (a JSON list), one a line; a JSON map as `key<TAB>value` lines.
output_list() {
  tf output -json "$1" | python3 -c 'import json, sys; sys.stdout.writelines(n + "\n" for n in json.load(sys.stdin) or [])'
}
output_map() {
  tf output -json "$1" | python3 -c 'import json, sys; sys.stdout.writelines(f"{k}\t{v}\n" for k, v in (json.load(sys.stdin) or {}).items())'
}

# The VM names, into the arrays TPUS and CPUS, and each VM's student into STUDENT. Loops go over these
# arrays, never over a `while read` of a pipe: ssh reads standard input and would swallow the rest.
load_names() {
  mapfile -t TPUS < <(output_list tpu_names)
  mapfile -t CPUS < <(output_list cpu_names)
  declare -gA STUDENT=() ACCOUNT=()
  local name value
  while IFS=$'\t' read -r name value; do STUDENT[$name]=$value; done < <(output_map students 2>/dev/null)
  while IFS=$'\t' read -r name value; do ACCOUNT[$name]=$value; done < <(output_map accounts 2>/dev/null)
}

student_of() {
  echo "${STUDENT[$1]:-$1}"
}

# Run a command on one VM through IAP: every worker of a TPU slice (JAX multi-process needs all of
# them in the same run), or the one CPU VM.
on_tpu() {
  local name=$1
  shift
  gcloud compute tpus tpu-vm ssh "$name" --project "$PROJECT" --zone "$ZONE" --tunnel-through-iap --worker=all --command "$*"
}
on_cpu() {
  local name=$1
  shift
  gcloud compute ssh "$name" --project "$PROJECT" --zone "$CPU_ZONE" --tunnel-through-iap --command "$*"
}

# TPU VMs labelled with the workshop: `name<TAB>state` lines (state READY, PREEMPTED, ...).
tpu_states() {
  gcloud compute tpus tpu-vm list --project "$PROJECT" --zone "$ZONE" --filter "labels.workshop=$WORKSHOP" \
    --format "value(name.basename(),state)"
}

# The workshop's queued resources (named after its VMs): `name<TAB>state` lines (WAITING_FOR_RESOURCES, ACTIVE, ...).
queued_states() {
  gcloud compute tpus queued-resources list --project "$PROJECT" --zone "$ZONE" --format "value(name.basename(),state.state)" |
    awk -F '\t' -v w="$WORKSHOP-" 'index($1, w) == 1'
}

# With queued_resources = true: a queued resource for every TPU VM that has neither a node nor a
# queued resource yet, with the arguments Terraform computed (output queued_create) and startup.sh.
create_queued() {
  local name state
  declare -A have=()
  while IFS=$'\t' read -r name state; do [[ -n "$name" ]] && have[$name]=$state; done < <(tpu_states; queued_states)
  while IFS= read -r -d '' name && IFS= read -r -d '' args; do
    if [[ -n "${have[$name]:-}" ]]; then
      echo "$name: ${have[$name]}"
      continue
    fi
    local argv=()
    mapfile -d '' -t argv < <(printf '%s' "$args" | python3 -c 'import json, sys; sys.stdout.write("\0".join(json.load(sys.stdin)))')
    echo "$name: asking for it through a queued resource"
    gcloud compute tpus queued-resources create "$name" "${argv[@]}" \
      --metadata-from-file "startup-script=$INFRA/startup.sh" </dev/null || return 1
  done < <(tf output -json queued_create | python3 -c '
import json, sys
for name, args in json.load(sys.stdin).items():
    sys.stdout.write(name + "\0" + json.dumps(args) + "\0")')
}

# Hosts of a TPU slice, from the TPU API (one network endpoint per worker).
tpu_hosts() {
  local hosts
  hosts=$(gcloud compute tpus tpu-vm describe "$1" --project "$PROJECT" --zone "$ZONE" --format "value(networkEndpoints.len())")
  [[ "$hosts" =~ ^[0-9]+$ ]] || hosts=1
  echo "$hosts"
}

# Lines of standard input that are not empty, each after the prefix $1.
prefix() {
  awk -v p="$1" 'NF { print p $0 }'
}

# Everything labelled with the workshop that still exists (and bills), one `kind: name` a line.
leftovers() {
  local name
  gcloud compute tpus tpu-vm list --project "$PROJECT" --zone "$ZONE" --filter "labels.workshop=$WORKSHOP" --format "value(name.basename())" | prefix "tpu vm: "
  # Queued resources carry no labels: they are named after the VMs, WORKSHOP-...
  gcloud compute tpus queued-resources list --project "$PROJECT" --zone "$ZONE" --format "value(name.basename())" |
    while read -r name; do [[ "$name" == "$WORKSHOP"-* ]] && echo "queued resource: $name"; done
  gcloud compute instances list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" --format "value(name)" | prefix "instance: "
  gcloud compute disks list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" --format "value(name)" | prefix "disk: "
  gcloud storage buckets list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" --format "value(name)" | prefix "bucket: "
  return 0
}

cmd_up() {
  load_settings
  validate
  print_cost
  confirm "Start them?"
  # A preempted Spot TPU VM cannot be restarted, only made again: delete it, and apply makes it anew
  # (its startup script restores labs/ from the last backup).
  local name state
  while IFS=$'\t' read -r name state; do
    if [[ "$state" == PREEMPTED ]]; then
      echo "$name was preempted: deleting it so that it is made again"
      gcloud compute tpus tpu-vm delete "$name" --project "$PROJECT" --zone "$ZONE" --quiet </dev/null ||
        echo "  could not delete $name; terraform will try to replace it"
    fi
  done < <(tpu_states)
  # A CPU VM that stopped (Spot preemption, or its idle check) keeps its disk: start it again.
  local zone
  while IFS=$'\t' read -r name zone; do
    [[ -n "$name" ]] || continue
    echo "$name is stopped: starting it again"
    gcloud compute instances start "$name" --project "$PROJECT" --zone "${zone:-$CPU_ZONE}" </dev/null ||
      echo "  could not start $name"
  done < <(gcloud compute instances list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP AND status=TERMINATED" \
    --format "value(name,zone.basename())")
  if [[ "$QUEUED" == true ]]; then
    # A Spot TPU VM made through a queued resource: when preempted, its queued resource is suspended
    # or failed; deleting it (with its node) lets create_queued ask again.
    while IFS=$'\t' read -r name state; do
      if [[ "$state" == SUSPENDED || "$state" == FAILED ]]; then
        echo "queued resource $name is $state: deleting it so that it is asked for again"
        gcloud compute tpus queued-resources delete "$name" --project "$PROJECT" --zone "$ZONE" --force --quiet </dev/null
      fi
    done < <(queued_states)
  fi
  if ! { tf init -input=false && tf apply -input=false -auto-approve -var-file="$TFVARS" &&
    { [[ "$QUEUED" != true ]] || create_queued; }; }; then
    echo "terraform apply (or a queued resource) FAILED. What exists now (and bills):" >&2
    leftovers | sed 's/^/  /' >&2
    echo "Run \`workshop.sh up\` again to finish (what exists is kept), or \`workshop.sh down --force\` to remove it." >&2
    return 1
  fi
  echo
  echo "Started. Each VM installs the student release and checks it (a few minutes): make workshop-status"
  echo "Then hand each student their link: make workshop-links"
}

cmd_cost() {
  load_settings
  validate
  print_cost
}

# links: per student, the one command that opens their JupyterLab: an ssh tunnel through IAP to the
# JupyterLab their VM runs on 127.0.0.1:8888. Also written to LOGS/WORKSHOP.links.tsv.
cmd_links() {
  load_settings
  load_names
  local name command table=$LOGS/$WORKSHOP.links.tsv n=0
  ((${#TPUS[@]} + ${#CPUS[@]})) || die "no VMs: run \`make workshop-up\` first"
  mkdir -p "$LOGS"
  printf 'student\taccount\tvm\tcommand\turl\n' >"$table"
  echo "Each student runs their command (gcloud, logged in as their account), leaves it running, and opens"
  echo "http://localhost:$JUPYTER_PORT/lab in a browser. (Another port if 8888 is taken: change both 8888s before the colon.)"
  for name in "${TPUS[@]}"; do
    command="gcloud compute tpus tpu-vm ssh $name --project $PROJECT --zone $ZONE --tunnel-through-iap -- -N -L $JUPYTER_PORT:localhost:$JUPYTER_PORT"
    printf '%s\t%s\t%s\t%s\t%s\n' "$(student_of "$name")" "${ACCOUNT[$name]:-}" "$name" "$command" "http://localhost:$JUPYTER_PORT/lab" >>"$table"
    printf '  %s%s:\n    %s\n' "$(student_of "$name")" "${ACCOUNT[$name]:+ (${ACCOUNT[$name]})}" "$command"
    n=$((n + 1))
  done
  for name in "${CPUS[@]}"; do
    command="gcloud compute ssh $name --project $PROJECT --zone $CPU_ZONE --tunnel-through-iap -- -N -L $JUPYTER_PORT:localhost:$JUPYTER_PORT"
    printf '%s\t%s\t%s\t%s\t%s\n' "$(student_of "$name")" "${ACCOUNT[$name]:-}" "$name" "$command" "http://localhost:$JUPYTER_PORT/lab" >>"$table"
    printf '  %s%s:\n    %s\n' "$(student_of "$name")" "${ACCOUNT[$name]:+ (${ACCOUNT[$name]})}" "$command"
    n=$((n + 1))
  done
  echo "$n link(s), also in $table"
}

cmd_status() {
  load_settings
  local name state preempted=()
  declare -A STATE=()
  echo "== TPU VMs labelled workshop=$WORKSHOP in $ZONE"
  while IFS=$'\t' read -r name state; do
    [[ -n "$name" ]] || continue
    STATE[$name]=$state
    if [[ "$state" == PREEMPTED ]]; then
      preempted+=("$name")
      printf '  %-28s %s   <- preempted: %s makes it again and restores labs/ from the backup\n' "$name" "$state" "'workshop.sh up'"
    else
      printf '  %-28s %s\n' "$name" "$state"
    fi
  done < <(tpu_states)
  if [[ "$QUEUED" == true ]]; then
    echo "== queued resources of workshop $WORKSHOP (WAITING_FOR_RESOURCES until Google has the capacity)"
    queued_states | awk -F '\t' '{ printf "  %-28s %s\n", $1, $2 }'
  fi
  echo "== CPU VMs labelled workshop=$WORKSHOP"
  gcloud compute instances list --project "$PROJECT" --filter "labels.workshop=$WORKSHOP" \
    --format "table(name,zone.basename(),status)"
  echo "== the kit on each VM ('ready: ...' once its smoke check passed; 'idle: ...' once it went idle)"
  load_names
  for name in "${TPUS[@]}"; do
    echo "-- $name ($(student_of "$name"))"
    if [[ "${STATE[$name]:-}" == PREEMPTED ]]; then
      echo "preempted"
      continue
    fi
    on_tpu "$name" "cat /var/lib/labkit/status 2>/dev/null || echo 'no status yet: still booting'" </dev/null || echo "unreachable"
  done
  for name in "${CPUS[@]}"; do
    echo "-- $name ($(student_of "$name"))"
    on_cpu "$name" "cat /var/lib/labkit/status 2>/dev/null || echo 'no status yet: still booting'" </dev/null || echo "unreachable"
  done
  if ((${#preempted[@]})); then
    echo "${#preempted[@]} preempted TPU VM(s): ${preempted[*]}; run \`make workshop-up\` to make them again"
  fi
}

# The student's notebook for lab N, copied from worker 0 to every worker of a multi-host slice, so
# that every process runs the same program.
share_notebook() {
  local name=$1 lab=$2 copy
  copy=$(mktemp -d)
  gcloud compute tpus tpu-vm scp --project "$PROJECT" --zone "$ZONE" --tunnel-through-iap --worker=0 \
    "$name:$KIT_HOME/labs/lab-$lab.ipynb" "$copy/" </dev/null &&
    gcloud compute tpus tpu-vm scp --project "$PROJECT" --zone "$ZONE" --tunnel-through-iap --worker=all \
      "$copy/lab-$lab.ipynb" "$name:/tmp/labkit-lab-$lab.ipynb" </dev/null
  local status=$?
  rm -rf "$copy"
  return $status
}

# run lab N [--configs C] | run grade [ARGS...]: on every VM at once, one log per VM. Commands run as
# the VM's student account, which owns labs/ and build/.
cmd_run() {
  load_settings
  local what=${1:-} lab="" configs="" name pids=() names=() failed=0 i hosts command
  shift || true
  case "$what" in
    lab)
      lab=${1:-}
      [[ "$lab" =~ ^[0-9]+$ ]] || die "usage: workshop.sh run lab N [--configs C]"
      shift
      if [[ "${1:-}" == --configs ]]; then configs=${2:?--configs needs a value}; fi
      ;;
    grade)
      die "the VMs hold the student release, without reference/ or tests/hidden/, so they cannot grade: run \`workshop.sh grade\` (make workshop-grade), which collects the notebooks and grades them here"
      ;;
    *) die "usage: workshop.sh run lab N [--configs C]" ;;
  esac
  mkdir -p "$LOGS"
  load_names
  for name in "${TPUS[@]}"; do
    : >"$LOGS/$name.log"
    if [[ "$what" == lab ]]; then
      # On a slice of several hosts every worker runs the lab and they join as one JAX program.
      hosts=$(tpu_hosts "$name")
      command="cd $KIT_HOME && sudo -u student make lab-$lab CONFIGS=${configs:-tpu} EXTRAS=tpu DEP_GROUPS=notebook LABKIT_TPU_HOSTS=$hosts"
      if ((hosts > 1)); then
        if ! share_notebook "$name" "$lab" >>"$LOGS/$name.log" 2>&1; then
          echo "  $name: could not copy lab-$lab.ipynb from worker 0 to every worker (see $LOGS/$name.log)"
          failed=1
          continue
        fi
        command="sudo install -o student -m 0644 /tmp/labkit-lab-$lab.ipynb $KIT_HOME/labs/lab-$lab.ipynb && $command"
      fi
    fi
    on_tpu "$name" "$command" >>"$LOGS/$name.log" 2>&1 </dev/null &
    pids+=($!)
    names+=("$name")
  done
  for name in "${CPUS[@]}"; do
    command="cd $KIT_HOME && sudo -u student make lab-$lab CONFIGS=${configs:-cpu-1,cpu-8} DEP_GROUPS=notebook"
    on_cpu "$name" "$command" >"$LOGS/$name.log" 2>&1 </dev/null &
    pids+=($!)
    names+=("$name")
  done
  ((${#pids[@]} + failed)) || die "no VMs: run \`make workshop-up\` first"
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
# DIR/submissions/<student>/ (ready for `nox -s grade -- --submissions DIR/submissions`), and the
# VMs' scoreboards merged into DIR/scoreboard/. A VM that cannot be reached (preempted, deleted when
# idle) gives its last backup from the bucket instead.
cmd_collect() {
  load_settings
  local out=${1:-$ROOT/build/workshop-results} name parts=() n=0 bucket student
  mkdir -p "$out/vms" "$out/submissions"
  load_names
  bucket=$(tf output -raw backup_bucket 2>/dev/null || true)
  for name in "${TPUS[@]}" "${CPUS[@]}"; do
    mkdir -p "$out/vms/$name"
    if [[ " ${TPUS[*]} " == *" $name "* ]]; then
      scp_from=(gcloud compute tpus tpu-vm scp --project "$PROJECT" --zone "$ZONE" --tunnel-through-iap --worker=0 --recurse)
    else
      scp_from=(gcloud compute scp --project "$PROJECT" --zone "$CPU_ZONE" --tunnel-through-iap --recurse)
    fi
    if ! "${scp_from[@]}" "$name:$KIT_HOME/labs" "$out/vms/$name/" </dev/null; then
      student=$(student_of "$name")
      if [[ -n "$bucket" ]] && gcloud storage rsync --recursive "gs://$bucket/labs/$student" "$out/vms/$name/labs" </dev/null; then
        echo "  $name: unreachable; its last backup came from gs://$bucket/labs/$student"
      else
        echo "  $name: its notebooks could not be copied"
      fi
    fi
    "${scp_from[@]}" "$name:$KIT_HOME/scoreboard" "$out/vms/$name/" </dev/null || echo "  $name: no results there (not graded yet?)"
    n=$((n + 1))
  done
  ((n)) || die "no VMs: run \`make workshop-up\` first"
  for name in "${TPUS[@]}" "${CPUS[@]}"; do
    student=$(student_of "$name")
    if compgen -G "$out/vms/$name/labs/lab-*.ipynb" >/dev/null; then
      mkdir -p "$out/submissions/$student"
      cp "$out/vms/$name"/labs/lab-*.ipynb "$out/submissions/$student/"
    fi
    [[ -f "$out/vms/$name/scoreboard/scoreboard.csv" ]] && parts+=("$out/vms/$name/scoreboard")
  done
  echo "notebooks of $(find "$out/submissions" -mindepth 1 -maxdepth 1 -type d | wc -l) student(s) in $out/submissions/"
  mkdir -p "$LOGS"
  printf '%s %s\n' "$(date -u +%FT%TZ)" "$out" >"$COLLECTED"
  if ((${#parts[@]} == 0)); then
    echo "no VM has graded results yet (run \`make workshop-run RUN=grade\` first); nothing to merge"
    return 0
  fi
  "$NOX" -f "$ROOT/noxfile.py" -s scoreboard -- merge "${parts[@]}" --out "$out/scoreboard"
  echo "merged ${#parts[@]} scoreboard(s) into $out/scoreboard/"
}

# grade [ARGS...]: collect into WORKSHOP_RESULTS (default build/workshop-results), then grade the
# students' notebooks here, with this checkout's reference/ and hidden tests, in the kit's sandbox.
cmd_grade() {
  local out=${WORKSHOP_RESULTS:-$ROOT/build/workshop-results}
  cmd_collect "$out" || return 1
  echo "grading $out/submissions/ here (nox -s grade)"
  "$NOX" -f "$ROOT/noxfile.py" -s grade -- --submissions "$out/submissions" --out "$out/graded" "$@"
}

# idle: the TPU VMs whose idle check saved labs/ and marked them idle are deleted (their account may
# not delete them itself). `workshop.sh up` makes them again, with labs/ restored.
cmd_idle() {
  load_settings
  load_names
  local name status idle=()
  for name in "${TPUS[@]}"; do
    status=$(on_tpu "$name" "cat /var/lib/labkit/status 2>/dev/null" </dev/null 2>/dev/null | head -n 1)
    [[ "$status" == idle:* ]] && idle+=("$name")
  done
  if ((${#idle[@]} == 0)); then
    echo "no TPU VM is idle"
    return 0
  fi
  echo "idle, with labs/ saved: ${idle[*]}"
  confirm "Delete these ${#idle[@]} TPU VM(s)?"
  for name in "${idle[@]}"; do
    gcloud compute tpus tpu-vm delete "$name" --project "$PROJECT" --zone "$ZONE" --quiet </dev/null
  done
}

cmd_down() {
  load_settings
  if [[ ! -f "$COLLECTED" && "${FORCE:-0}" != 1 ]]; then
    die "the students' work has not been collected ($COLLECTED is missing): run \`make workshop-collect\` first, or \`workshop.sh down --force\` to destroy it uncollected"
  fi
  confirm "Destroy every VM of workshop $WORKSHOP in project $PROJECT (and the bucket of labs/ backups)?"
  local destroyed=0 left name state
  # Queued resources are workshop.sh's, not Terraform's: delete them (with their nodes) first.
  while IFS=$'\t' read -r name state; do
    [[ -n "$name" ]] || continue
    echo "deleting queued resource $name ($state) and its TPU VM"
    gcloud compute tpus queued-resources delete "$name" --project "$PROJECT" --zone "$ZONE" --force --quiet </dev/null ||
      echo "  could not delete queued resource $name" >&2
  done < <(queued_states)
  if tf init -input=false && tf destroy -input=false -auto-approve -var-file="$TFVARS"; then
    destroyed=1
  else
    echo "terraform destroy FAILED; checking what is left anyway" >&2
  fi
  echo "checking that nothing labelled workshop=$WORKSHOP is left..."
  left=$(leftovers)
  if [[ -n "${left//[[:space:]]/}" ]]; then
    echo "STILL THERE (and still billed), labelled workshop=$WORKSHOP:" >&2
    while read -r name; do echo "  $name"; done <<<"$left" >&2
    echo "delete them in the console or with gcloud (compute tpus tpu-vm delete / compute tpus queued-resources delete / compute instances delete / compute disks delete / storage rm -r), or run down again" >&2
    return 1
  fi
  if ((!destroyed)); then
    echo "nothing labelled is left, but terraform destroy failed: run \`workshop.sh down\` again to clear the rest (firewall rule, NAT, service account)" >&2
    return 1
  fi
  rm -f "$COLLECTED"
  echo "nothing labelled workshop=$WORKSHOP is left in $PROJECT"
}

main() {
  local args=() a
  YES=0
  FORCE=0
  for a in "$@"; do
    case "$a" in
      --yes | -y) YES=1 ;;
      --force) FORCE=1 ;;
      *) args+=("$a") ;;
    esac
  done
  set -- "${args[@]+"${args[@]}"}"
  local cmd=${1:-help}
  shift || true
  case "$cmd" in
    up) cmd_up "$@" ;;
    cost) cmd_cost "$@" ;;
    links) cmd_links "$@" ;;
    status) cmd_status "$@" ;;
    run) cmd_run "$@" ;;
    collect) cmd_collect "$@" ;;
    grade) cmd_grade "$@" ;;
    idle) cmd_idle "$@" ;;
    down) cmd_down "$@" ;;
    help | -h | --help) usage ;;
    *)
      usage >&2
      exit 2
      ;;
  esac
}

main "$@"

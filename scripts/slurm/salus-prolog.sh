#!/bin/bash
# Slurm TaskProlog for Salus: a task of a job that asked for the "salus" generic resource
# (for example --gres=salus:8, eight 256 MiB units of the node's daemon) gets
#
#   export SALUS_ENDPOINT=ipc:///run/salus/salus.sock
#
# which slurmstepd applies to the task's environment, so the Salus clients find the node's
# salus-server by themselves. A task of a job that did not ask for it gets nothing.
#
# Install: slurm.conf `TaskProlog=/etc/slurm/salus-prolog.sh` (scripts/slurm/README.md).
# It runs as the job's user, with the task's environment, before every task starts.
#
# Which variable holds the request depends on Slurm's version and on how the task was
# started (sbatch, salloc, srun), so every one of these is read, and any salus entry with a
# count above 0 in any of them counts:
#   SLURM_STEP_GRES, SLURM_JOB_GRES, SLURM_GRES   "gpu:a100:2,salus:8" (NAME[:TYPE][:COUNT])
#   SLURM_TRES_PER_NODE, SLURM_TRES_PER_TASK,
#   SLURM_TRES_PER_JOB, SLURM_TRES_PER_SOCKET     "cpu:2,gres/salus:8" or "gres:salus:8"
#
# Configuration: /etc/salus/slurm.conf (another file: $SALUS_SLURM_CONF), KEY=VALUE lines,
# '#' comments; read, never executed:
#   SALUS_ENDPOINT=ipc:///run/salus/salus.sock   what the tasks are told
#   SALUS_GRES_NAME=salus                         the generic resource's name in gres.conf
#
# It always exits 0: a job runs whether or not Salus is configured; problems are reported on
# stderr (slurmd's log).

DEFAULT_ENDPOINT="ipc:///run/salus/salus.sock"
DEFAULT_GRES_NAME="salus"
GRES_VARIABLES="SLURM_STEP_GRES SLURM_JOB_GRES SLURM_GRES SLURM_TRES_PER_NODE
  SLURM_TRES_PER_TASK SLURM_TRES_PER_JOB SLURM_TRES_PER_SOCKET"

warn() { echo "salus-prolog: $*" >&2; }

# read_config FILE: sets endpoint and gres_name from FILE's KEY=VALUE lines.
read_config() {
  local file=$1 key value
  [ -r "$file" ] || return 0
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [ -n "$line" ] || continue
    key=${line%%=*}
    value=${line#*=}
    [ "$key" != "$line" ] || { warn "$file: not KEY=VALUE: $line"; continue; }
    key=${key%"${key##*[![:space:]]}"}
    value=${value#"${value%%[![:space:]]*}"}
    # A value may be quoted as a whole.
    case $value in
      \"*\") value=${value#\"}; value=${value%\"} ;;
      \'*\') value=${value#\'}; value=${value%\'} ;;
    esac
    case $key in
      SALUS_ENDPOINT) endpoint=$value ;;
      SALUS_GRES_NAME) gres_name=$value ;;
      *) warn "$file: unknown key $key" ;;
    esac
  done < "$file"
}

# units_requested SPEC NAME: prints the count of NAME in a GRES or TRES list (0 if absent).
units_requested() {
  local spec=$1 name=$2 entry rest count total=0
  local IFS=,
  for entry in $spec; do
    entry=${entry//[[:space:]]/}
    case $entry in
      "gres/$name" | "gres/$name:"* | "gres:$name" | "gres:$name:"*) rest=${entry#gres?} ;;
      "$name" | "$name:"*) rest=$entry ;;
      *) continue ;;
    esac
    rest=${rest#"$name"}
    # What is left: "", ":COUNT", ":TYPE" or ":TYPE:COUNT"; a missing count is 1.
    count=${rest##*:}
    if [ -z "$rest" ] || ! [[ $count =~ ^[0-9]+$ ]]; then
      count=1
    fi
    total=$((total + 10#$count))
  done
  echo "$total"
}

main() {
  local endpoint=$DEFAULT_ENDPOINT gres_name=$DEFAULT_GRES_NAME var units=0
  read_config "${SALUS_SLURM_CONF:-/etc/salus/slurm.conf}"
  if ! [[ $gres_name =~ ^[A-Za-z0-9_.-]+$ ]]; then
    warn "SALUS_GRES_NAME is not a GRES name: '$gres_name'"
    return 0
  fi
  for var in $GRES_VARIABLES; do
    units=$(units_requested "${!var-}" "$gres_name")
    [ "$units" -gt 0 ] && break
  done
  [ "$units" -gt 0 ] || return 0
  # slurmstepd takes the value to the end of the line, as it is: no spaces, no quotes.
  if ! [[ $endpoint =~ ^(ipc|tcp)://[^[:space:]\"\'\;\`\$]+$ ]]; then
    warn "SALUS_ENDPOINT is not an ipc:// or tcp:// endpoint: '$endpoint'"
    return 0
  fi
  echo "export SALUS_ENDPOINT=$endpoint"
}

main
exit 0

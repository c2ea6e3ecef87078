# Sourced by the hooks Slurm runs as root (slurm-hook.sh, runyard-healthcheck.sh): the few
# settings they need from the node's agent.env, read as data. The file is never sourced
# (a line `$(cmd)` or `cmd` would run as root), and it is read only when root owns it and
# its folder and nobody else may write to either: whoever can write it chooses the Python
# root runs (RUNYARD_HOME). `runyard doctor --only slurm` checks the same.

# read_agent_env FILE: export FILE's RUNYARD_NODE, RUNYARD_HOME, RUNYARD_KERNEL_LOG,
# RUNYARD_AGENT_STATE_ROOT, RUNYARD_HEALTHCHECK_STATE_ROOT and RUNYARD_EXPECT_GPUS lines
# (KEY=value, the value literal, one pair of double quotes dropped); every other line is
# skipped. No FILE: nothing read, the hooks' defaults. A FILE root must not trust: says why
# on stderr and returns 1, having exported nothing.
read_agent_env() {
  _ry_file=$1
  [ -e "$_ry_file" ] || [ -L "$_ry_file" ] || return 0
  if [ -L "$_ry_file" ] || [ ! -f "$_ry_file" ]; then
    echo "runyard: $_ry_file is not a regular file: not read (root reads agent.env only as a plain file)" >&2
    return 1
  fi
  for _ry_path in "$_ry_file" "$(dirname -- "$_ry_file")"; do
    if ! _ry_owner_mode=$(stat -L -c '%u %a' -- "$_ry_path"); then
      echo "runyard: cannot stat $_ry_path: $_ry_file not read" >&2
      return 1
    fi
    _ry_uid=${_ry_owner_mode% *} _ry_mode=${_ry_owner_mode#* }
    if [ "$_ry_uid" != 0 ] || [ $((0$_ry_mode & 022)) -ne 0 ]; then
      echo "runyard: $_ry_path is owned by uid $_ry_uid with mode $_ry_mode: $_ry_file not" \
        "read (root reads it only from a file and folder root owns that no one else may" \
        "write: chown root $_ry_path; chmod go-w $_ry_path)" >&2
      return 1
    fi
  done
  while IFS= read -r _ry_line || [ -n "$_ry_line" ]; do
    case $_ry_line in
      RUNYARD_NODE=* | RUNYARD_HOME=* | RUNYARD_KERNEL_LOG=* | RUNYARD_AGENT_STATE_ROOT=* | \
        RUNYARD_HEALTHCHECK_STATE_ROOT=* | RUNYARD_EXPECT_GPUS=*) ;;
      *) continue ;;
    esac
    _ry_value=${_ry_line#*=}
    case $_ry_value in \"*\") _ry_value=${_ry_value#\"} _ry_value=${_ry_value%\"} ;; esac
    export "${_ry_line%%=*}=$_ry_value"
  done < "$_ry_file"
}

#!/usr/bin/env bash
# slurm-up.sh - a REAL single-node SLURM cluster on localhost for CI
# (stereolens copy of the project's shared recipe; used by tests/test_slurm.py
# with profiles/slurm-ci; see tools/slurm/README.md)
# (Debian 12 "bookworm", SLURM 22.05.8 from Debian, munge, optional slurmdbd+MariaDB),
# used to run Snakemake workflows through snakemake-executor-plugin-slurm for real.
#
#   bash slurm-up.sh up      apt install (if missing) + configure + start daemons + smoke test.
#                            Daemons keep running; their PIDs are in $SLURM_CI_DIR/pids/.
#   bash slurm-up.sh install apt install what is missing (apt-get update first; nothing when
#                            all is installed). Starts nothing (CI: .ci/run).
#   bash slurm-up.sh down    stop the daemons that `up` started (by recorded PID only).
#   bash slurm-up.sh status  show recorded PIDs and sinfo.
#
# Must run as root. Works with no stdin (CI: `bash slurm-up.sh up </dev/null`).
# No systemd needed: every daemon runs in the foreground (-D / --foreground) as a
# background child of this script, with stdin/stdout/stderr redirected to files,
# so a CI runner that waits for EOF on its pipe is not held open by the daemons.
#
# Environment knobs:
#   SLURM_CI_ACCOUNTING dbd  (default) slurmdbd + MariaDB, so `sacct` works and the plugin's
#                            default status command (sacct) and account checks work unchanged.
#                       none no DB; `sacct` then fails ("Slurm accounting storage is disabled"),
#                            so the profile MUST set `slurm-status-command: squeue` (otherwise
#                            the plugin loses track of every job and snakemake hangs).
#                            slurm_account still works there (plugin warns, skips validation).
#   SLURM_CI_DIR        state/spool/log/pid dir           (default /var/tmp/slurm-ci)
#   SLURM_CI_PARTITION  partition name                    (default debug)
#   SLURM_CI_ACCOUNT    account created for root (dbd)    (default ci)
#   SLURM_CI_CPUS       CPUs the node advertises          (default: nproc; may be larger than
#                       nproc, e.g. 8, so rules with threads>nproc can be scheduled; the node
#                       is then oversubscribed - SlurmdParameters=config_overrides allows it)
set -euo pipefail

ACCOUNTING=${SLURM_CI_ACCOUNTING:-dbd}
D=${SLURM_CI_DIR:-/var/tmp/slurm-ci}
PARTITION=${SLURM_CI_PARTITION:-debug}
ACCOUNT=${SLURM_CI_ACCOUNT:-ci}
CPUS=${SLURM_CI_CPUS:-$(nproc)}
CLUSTER=ci
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=slurm-ci-pw   # local socket-only DB on a throwaway CI machine

export DEBIAN_FRONTEND=noninteractive
case "$ACCOUNTING" in dbd|none) ;; *) echo "SLURM_CI_ACCOUNTING must be dbd or none" >&2; exit 2;; esac

log() { printf '[slurm-up %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

dump_logs() {
  local f
  for f in "$D"/log/*; do
    [ -f "$f" ] || continue
    echo "----- tail $f -----"
    tail -n 25 "$f" || true
  done
}

die() { log "ERROR: $*"; dump_logs; exit 1; }

# True if PID exists and is not a zombie.
is_alive() {
  local pid=$1 state
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$state" != Z ]
}

# ------------------------------------------------------------------ install
install_pkgs() {
  # iproute2: ss, for the port check before the daemons start
  local pkgs=(munge slurm-wlm slurm-client iproute2) missing=() p created_policy=0
  [ "$ACCOUNTING" = dbd ] && pkgs+=(slurmdbd mariadb-server)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "packages already installed: ${pkgs[*]}"
    return 0
  fi
  # Keep maintainer scripts from starting munge/slurm/mariadb themselves.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    created_policy=1
  fi
  log "apt-get install ${missing[*]}"
  local rc=0
  { apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}"; } \
    > "$D/log/apt.log" 2>&1 || rc=$?
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || { tail -n 30 "$D/log/apt.log"; die "apt-get failed (rc=$rc)"; }
}

# ------------------------------------------------------------------ configure
configure() {
  local host mem_hw mem
  host=$(hostname -s)
  getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >> /etc/hosts
  mem_hw=$(/usr/sbin/slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mem=$(( mem_hw > 2048 ? mem_hw - 1024 : mem_hw ))   # headroom for the daemons

  # Cold start: fresh controller state and spool every time (job IDs restart at 1).
  rm -rf "$D/state" "$D/spool"
  mkdir -p "$D/state" "$D/spool" "$D/run"
  chown slurm:slurm "$D/state" "$D/run" "$D/log"

  # munge: key (Debian's postinst normally creates it) and runtime dirs
  if [ ! -s /etc/munge/munge.key ]; then
    /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge; chmod 0755 /run/munge

  mkdir -p /etc/slurm
  if [ -f /etc/slurm/slurm.conf ] && ! grep -q '^# written by slurm-up.sh' /etc/slurm/slurm.conf; then
    cp /etc/slurm/slurm.conf "/etc/slurm/slurm.conf.bak.$(date +%s)"
  fi
  local acct_lines
  if [ "$ACCOUNTING" = dbd ]; then
    acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
  else
    acct_lines="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
  fi
  cat > /etc/slurm/slurm.conf <<EOF
# written by slurm-up.sh (single-node CI cluster on localhost)
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: plain process tracking, CPU binding via sched_setaffinity only
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# reject impossible requests (too many CPUs/too much memory) at sbatch time instead of
# leaving them PENDING (Reason=PartitionConfig) forever, which would hang snakemake
EnforcePartLimits=ALL
# squeue keeps finished jobs this long; the plugin's squeue status mode needs >= 3*init interval
MinJobAge=300
# let the node advertise more CPUs than the VM has (SLURM_CI_CPUS > nproc)
SlurmdParameters=config_overrides
$acct_lines
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

  if [ "$ACCOUNTING" = dbd ]; then
    cat > /etc/slurm/slurmdbd.conf <<EOF
# written by slurm-up.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
DebugLevel=info
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
    chown slurm:slurm /etc/slurm/slurmdbd.conf
    chmod 600 /etc/slurm/slurmdbd.conf
  fi
  log "configured: node $host CPUs=$CPUS RealMemory=$mem partition=$PARTITION accounting=$ACCOUNTING"
}

# ------------------------------------------------------------------ daemons
start_daemon() {   # name cmd...
  local name=$1; shift
  "$@" </dev/null >"$D/log/$name.out" 2>&1 &
  echo $! > "$D/pids/$name.pid"
  log "started $name (pid $!)"
}

wait_for() {       # daemon-name timeout-s description cmd...
  local name=$1 t=$2 desc=$3; shift 3
  local end=$((SECONDS + t)) pid
  pid=$(cat "$D/pids/$name.pid")
  until "$@" >/dev/null 2>&1; do
    is_alive "$pid" || die "$name (pid $pid) exited while waiting for: $desc"
    [ "$SECONDS" -lt "$end" ] || die "timed out after ${t}s waiting for: $desc"
    sleep 0.3
  done
  log "ok: $desc"
}

port_free() { ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

start_all() {
  local p
  for p in 6817 6818 6819; do
    port_free "$p" || die "TCP port $p already in use (another slurm running?); run '$0 down' or stop it"
  done

  start_daemon munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground
  wait_for munged 20 "munge credential round-trip" bash -c 'munge -n | unmunge'

  if [ "$ACCOUNTING" = dbd ]; then
    mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
    if [ ! -d /var/lib/mysql/mysql ]; then
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql > "$D/log/mariadb-install.log" 2>&1
    fi
    # socket only (no TCP port), slurm-recommended InnoDB settings
    start_daemon mariadbd /usr/sbin/mariadbd --user=mysql --skip-networking \
      --innodb-buffer-pool-size=1024M --innodb-lock-wait-timeout=900
    wait_for mariadbd 60 "mariadb ping" mariadb-admin ping
    mariadb -e "CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;"
    start_daemon slurmdbd /usr/sbin/slurmdbd -D
    wait_for slurmdbd 60 "slurmdbd answers sacctmgr" sacctmgr -n list cluster
  fi

  start_daemon slurmctld /usr/sbin/slurmctld -D
  wait_for slurmctld 60 "slurmctld UP (scontrol ping)" bash -c 'scontrol ping | grep -q UP'
  start_daemon slurmd /usr/sbin/slurmd -D
  wait_for slurmd 60 "node idle (sinfo)" bash -c 'sinfo -h -N -o %T | grep -q "^idle"'

  if [ "$ACCOUNTING" = dbd ]; then
    # slurmctld registers the cluster in slurmdbd by itself; accounts need it to exist
    wait_for slurmdbd 60 "cluster '$CLUSTER' registered in slurmdbd" \
      bash -c "sacctmgr -n -P list cluster format=cluster | grep -qx $CLUSTER"
    sacctmgr -i add account "$ACCOUNT" Description=ci Organization=ci >/dev/null 2>&1 || true
    sacctmgr -i add user root Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null 2>&1 || true
    sacctmgr -n -P list assoc user=root format=account | grep -qx "$ACCOUNT" \
      || die "could not create account association root/$ACCOUNT"
    log "ok: account '$ACCOUNT' for root"
  fi
}

smoke() {
  sinfo
  local out jid f
  out=$(timeout 60 srun -N1 -n1 hostname) || die "srun failed"
  log "ok: srun hostname -> $out"
  jid=$(timeout 120 sbatch --parsable --wait -p "$PARTITION" -t 2 --mem 50 \
        -o "$D/log/smoke-%j.out" --wrap 'echo smoke-ok job=$SLURM_JOB_ID host=$(hostname)') \
        || die "sbatch --wait failed"
  f="$D/log/smoke-$jid.out"
  grep -q smoke-ok "$f" || die "sbatch job $jid produced no output"
  log "ok: sbatch job $jid -> $(cat "$f")"
  if [ "$ACCOUNTING" = dbd ]; then
    wait_for slurmdbd 30 "sacct sees job $jid COMPLETED" \
      bash -c "sacct -X -n -P -j $jid -o State | grep -qx COMPLETED"
  fi
}

up() {
  [ "$(id -u)" = 0 ] || { echo "must run as root" >&2; exit 1; }
  mkdir -p "$D/log" "$D/pids"
  local t0=$SECONDS
  down quiet
  install_pkgs
  local t1=$SECONDS
  configure
  start_all
  local t2=$SECONDS
  smoke
  log "cluster up: install $((t1 - t0))s, configure+start $((t2 - t1))s, smoke $((SECONDS - t2))s"
  log "PIDs: $(for n in munged mariadbd slurmdbd slurmctld slurmd; do [ -f "$D/pids/$n.pid" ] && printf '%s=%s ' "$n" "$(cat "$D/pids/$n.pid")"; done)"
}

stop_one() {       # name expected-cmdline-substring
  local name=$1 expect=$2 pidf="$D/pids/$1.pid" pid i
  [ -f "$pidf" ] || return 0
  pid=$(cat "$pidf")
  if is_alive "$pid" && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$expect"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 80); do is_alive "$pid" || break; sleep 0.25; done
    if is_alive "$pid"; then
      log "$name (pid $pid) ignored SIGTERM for 20s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$pidf"
}

down() {
  [ "${1:-}" = quiet ] || log "stopping daemons recorded in $D/pids"
  stop_one slurmd    /usr/sbin/slurmd
  stop_one slurmctld /usr/sbin/slurmctld
  stop_one slurmdbd  /usr/sbin/slurmdbd
  stop_one mariadbd  /usr/sbin/mariadbd
  stop_one munged    /usr/sbin/munged
}

status() {
  local n
  for n in munged mariadbd slurmdbd slurmctld slurmd; do
    [ -f "$D/pids/$n.pid" ] || continue
    if is_alive "$(cat "$D/pids/$n.pid")"; then echo "$n pid $(cat "$D/pids/$n.pid") running"
    else echo "$n pid $(cat "$D/pids/$n.pid") NOT running"; fi
  done
  sinfo 2>&1 || true
}

case "${1:-}" in
  install) [ "$(id -u)" = 0 ] || { echo "must run as root" >&2; exit 1; }
           mkdir -p "$D/log" "$D/pids"; install_pkgs ;;
  up) up ;;
  down) down ;;
  status) status ;;
  smoke) smoke ;;
  *) echo "usage: $0 install|up|down|status|smoke" >&2; exit 2 ;;
esac

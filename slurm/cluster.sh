#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (Debian's slurmctld, slurmd, slurmdbd, munge and a
# MariaDB server for accounting), for launcher=slurm and its tests:
#
#   slurm/cluster.sh up       install what is missing (apt, as root), start what is not running
#   slurm/cluster.sh down     cancel the cluster's jobs, stop its daemons (state is kept)
#   slurm/cluster.sh status   exit 0 when the cluster answers (sinfo, sacct), else 1
#
# `make slurm` and `make slurm-stop` call it. Configuration: slurm.conf.in and slurmdbd.conf.in
# beside this file, rendered into /etc/slurm/. State: $MESH_SLURM_STATE (/var/lib/mesh-slurm),
# logs in /var/log/mesh-slurm, pids in /run/mesh-slurm. No systemd: the daemons are started
# directly, each with its own pid file.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${MESH_SLURM_STATE:-/var/lib/mesh-slurm}
RUN=/run/mesh-slurm
LOG=/var/log/mesh-slurm
CONF=/etc/slurm
DB_PORT=3307 # not 3306: a MariaDB of the system's own may be there
DB_SOCKET=$RUN/mysql/mysqld.sock
RESERVE_MB=2048 # memory the node does not offer to jobs (see slurm.conf.in)
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
MARK="# Written by mesh-recursive's slurm/cluster.sh from"

say() { echo "[slurm] $*"; }
die() {
	echo "[slurm] error: $*" >&2
	exit 1
}

alive() { # alive PIDFILE: the process it names runs
	[[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_until() { # wait_until SECONDS WHAT COMMAND...: poll COMMAND until it succeeds
	local seconds=$1 what=$2
	shift 2
	for ((i = 0; i < seconds * 4; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.25
	done
	die "$what did not come up within ${seconds}s; see $LOG/"
}

detached() { # detached COMMAND...: run it with nothing of ours open but /dev/null: a daemon must not
	# hold a pipe of whoever called make (a CI log, a test's output) or the lock below
	(
		for fd in /proc/self/fd/*; do
			fd=${fd##*/}
			((fd > 2)) && eval "exec $fd>&-" 2>/dev/null
		done
		exec "$@" </dev/null >/dev/null 2>&1
	)
}

loopback_name() { # this machine's name resolves to a loopback address (what NoInAddrAny binds)
	[[ $(getent ahostsv4 "$(hostname)" | awk 'NR == 1 { print $1 }') == 127.* ]]
}

daemon() { # daemon COMMAND...: detached, bound to 127.0.0.1 (slurm.conf.in: NoInAddrAny)
	if loopback_name; then
		detached "$@"
	else # its own host name, localhost, in a UTS namespace of its own
		detached unshare --uts sh -c 'hostname localhost && exec "$@"' sh "$@"
	fi
}

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
node_state() { sinfo -h -n localhost -o %T 2>/dev/null | head -1; }
node_ready() { [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]]; }
sacct_works() { sacct -n -X -S now-1minutes -o JobID >/dev/null 2>&1; }
answers() { command -v sinfo >/dev/null && node_ready && sacct_works; }
db() { mariadb --socket="$DB_SOCKET" -u root "$@"; }

cluster_up() {
	alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid" && alive "$RUN/slurmdbd.pid" &&
		alive "$RUN/mysql/mariadbd.pid" && munge_works && answers
}

install_packages() {
	local missing=()
	for package in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
	done
	((${#missing[@]})) || return 0
	command -v apt-get >/dev/null || die "make slurm needs Debian's apt-get to install ${missing[*]}"
	say "installing ${missing[*]} (apt-get, log in $LOG/apt.log)"
	apt-get update -qq >>"$LOG/apt.log" 2>&1 || die "apt-get update failed; see $LOG/apt.log"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
		>>"$LOG/apt.log" 2>&1 || die "apt-get install ${missing[*]} failed; see $LOG/apt.log"
}

render() { # render TEMPLATE TARGET MODE KEY=VALUE...: fill @KEY@ fields; replace TARGET if it changed
	local template=$1 target=$2 mode=$3 text
	shift 3
	text="$MARK $template"$'\n'"$(cat "$HERE/$template")"
	for pair in "$@"; do
		text=${text//@${pair%%=*}@/${pair#*=}}
	done
	if [[ -e $target ]] && ! head -1 "$target" | grep -qF "$MARK"; then
		die "$target exists and was not written by slurm/cluster.sh: this machine has a SLURM of its own"
	fi
	if [[ ! -e $target ]] || [[ $(cat "$target") != "$text" ]]; then
		install -m "$mode" /dev/null "$target.new"
		printf '%s\n' "$text" >"$target.new"
		mv "$target.new" "$target"
		CHANGED+=" $target"
	fi
}

write_configs() {
	local detected hardware memory password
	detected=$(slurmd -C | head -1) # NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105
	hardware=$(tr ' ' '\n' <<<"$detected" | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | paste -sd' ')
	memory=$(($(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$detected") - RESERVE_MB))
	((memory >= 1024)) || memory=1024
	if [[ ! -s $STATE/db.pass ]]; then
		(umask 077 && head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$STATE/db.pass")
	fi
	password=$(cat "$STATE/db.pass")
	mkdir -p "$CONF"
	render slurm.conf.in "$CONF/slurm.conf" 644 STATE="$STATE" RUN="$RUN" LOG="$LOG" \
		HARDWARE="$hardware" REAL_MEMORY="$memory" RESERVE_MB="$RESERVE_MB"
	render slurmdbd.conf.in "$CONF/slurmdbd.conf" 600 RUN="$RUN" LOG="$LOG" DB_PORT="$DB_PORT" DB_PASS="$password"
}

start_munge() {
	munge_works && return 0
	[[ -s /etc/munge/munge.key ]] || mungekey --create >/dev/null
	install -d -o munge -g munge -m 0755 /run/munge
	detached runuser -u munge -- munged
	wait_until 10 munged munge_works
	cp /run/munge/munged.pid "$RUN/munged.pid" # ours: `down` stops it
}

start_mariadb() {
	local data=$STATE/mysql
	if [[ ! -d $data/mysql ]]; then
		say "creating the accounting database in $data"
		install -d -o mysql -g mysql "$data"
		mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=socket \
			--skip-test-db >"$LOG/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $LOG/mariadb-install.log"
	fi
	install -d -o mysql -g mysql "$RUN/mysql"
	[[ -e $LOG/mariadb.log ]] || install -o mysql -g mysql -m 640 /dev/null "$LOG/mariadb.log"
	if ! alive "$RUN/mysql/mariadbd.pid"; then
		detached setsid --fork mariadbd --no-defaults --user=mysql --datadir="$data" --socket="$DB_SOCKET" \
			--pid-file="$RUN/mysql/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
			--log-error="$LOG/mariadb.log" --performance-schema=OFF --innodb-use-native-aio=0 \
			--innodb-buffer-pool-size=128M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900
	fi
	wait_until 60 MariaDB mariadb-admin --socket="$DB_SOCKET" ping
	db -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1';
		ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$STATE/db.pass")';
		GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurm() {
	alive "$RUN/slurmdbd.pid" || daemon slurmdbd
	wait_until 120 slurmdbd sacctmgr -n list cluster
	if ! sacctmgr -n -P list cluster format=Cluster | grep -qx mesh; then
		sacctmgr -i add cluster mesh >/dev/null
	fi
	alive "$RUN/slurmctld.pid" || daemon slurmctld
	wait_until 60 slurmctld scontrol ping
	alive "$RUN/slurmd.pid" || daemon slurmd -N localhost
	wait_until 60 "the node" sinfo -h -n localhost -o %T
	# A node left down or drained by an earlier stop (a killed slurmd) is put back in service.
	if [[ $(node_state) =~ ^(down|drain|drained|draining|unknown)\*?$ ]]; then
		scontrol update nodename=localhost state=resume 2>/dev/null || true
	fi
	wait_until 60 "the node (idle)" node_ready
	wait_until 60 sacct sacct_works
}

up() {
	[[ $(id -u) == 0 ]] || die "make slurm needs root: it installs Debian packages and starts daemons as root"
	mkdir -p "$STATE" "$RUN" "$LOG"
	exec 9>"$RUN/lock"
	flock 9 # two callers at once (pytest-xdist workers): one starts the cluster, the other waits
	mkdir -p "$STATE/slurmctld" "$STATE/slurmd"
	local started=$SECONDS
	install_packages
	CHANGED=""
	write_configs
	if [[ -z $CHANGED ]] && cluster_up; then
		say "cluster up: $(describe)"
		return 0
	fi
	# A daemon still running on an older configuration is restarted (running jobs go on).
	if [[ $CHANGED == *slurmdbd.conf* ]]; then stop_pid slurmdbd "$RUN/slurmdbd.pid"; fi
	if [[ $CHANGED == *slurm.conf* ]]; then
		stop_pid slurmd "$RUN/slurmd.pid"
		stop_pid slurmctld "$RUN/slurmctld.pid"
	fi
	start_munge
	start_mariadb
	start_slurm
	say "cluster started in $((SECONDS - started))s: $(describe)"
	say "logs in $LOG; stop it with make slurm-stop"
}

describe() {
	local node
	node=$(sinfo -h -n localhost -o '%c CPUs, %m MB, %T')
	echo "partition $(sinfo -h -o %R | paste -sd,), node localhost ($node), accounting by slurmdbd"
}

stop_pid() { # stop_pid NAME PIDFILE: SIGTERM, then SIGKILL after 20 s
	local name=$1 file=$2 pid
	alive "$file" || return 0
	pid=$(cat "$file")
	kill "$pid"
	for ((i = 0; i < 80; i++)); do
		kill -0 "$pid" 2>/dev/null || {
			rm -f "$file"
			return 0
		}
		sleep 0.25
	done
	say "$name ($pid) did not stop on SIGTERM: SIGKILL"
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$file"
}

down() {
	[[ $(id -u) == 0 ]] || die "make slurm-stop needs root"
	[[ -d $RUN ]] || {
		say "cluster not running"
		return 0
	}
	exec 9>"$RUN/lock"
	flock 9
	if alive "$RUN/slurmctld.pid"; then
		local jobs
		jobs=$(squeue -h -o %A 2>/dev/null || true)
		if [[ -n $jobs ]]; then
			say "cancelling $(wc -l <<<"$jobs") job(s)"
			scancel $jobs 2>/dev/null || true
			for ((i = 0; i < 60 && $(squeue -h -o %A 2>/dev/null | wc -l) > 0; i++)); do sleep 0.5; done
		fi
	fi
	stop_pid slurmd "$RUN/slurmd.pid"
	stop_pid slurmctld "$RUN/slurmctld.pid"
	stop_pid slurmdbd "$RUN/slurmdbd.pid"
	stop_pid mariadbd "$RUN/mysql/mariadbd.pid"
	if [[ -s $RUN/munged.pid ]] && [[ $(cat /run/munge/munged.pid 2>/dev/null) == $(cat "$RUN/munged.pid") ]]; then
		stop_pid munged "$RUN/munged.pid"
	fi
	rm -f "$RUN/munged.pid"
	say "cluster stopped (state kept in $STATE)"
}

status() { # as any user: the cluster answers
	if answers; then
		say "cluster up: $(describe)"
	else
		say "cluster not running (start it with make slurm)"
		return 1
	fi
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
*)
	echo "usage: $0 up|down|status" >&2
	exit 2
	;;
esac

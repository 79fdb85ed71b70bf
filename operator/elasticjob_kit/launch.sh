# elasticjob's launcher, copied into each job pod. install.py writes the two lines above: the interpreter (the
# kit's static busybox, or /bin/sh when the kit has none) and where the kit lies (kit=...).
#
#   launch torchrun ARGS...                          torchrun, warm (elasticjob_warm.torchrun) when it can be
#   launch PYTHON -m torch.distributed.run ARGS...   the same, with the user's own Python
#   launch PYTHON -m elasticjob_warm.torchrun ARGS...
#   launch store                                     the job's rendezvous store (elasticjob_store)
#   torchrun ARGS...                                 (path/torchrun: a shell command's torchrun)
#
# Anything it cannot run warm runs as the user wrote it, and it says why on stderr. Warm or not, torch's own
# checks then apply: elasticjob_warm.torchrun itself falls back to plain torchrun on a torch it does not know.
set -u

say() { echo "elasticjob kit: $*" >&2; }

# The user's PATH without the kit's path/ (a shell command has it first), so that torchrun is the image's.
drop_kit_path() {
    kept=""
    old_ifs=$IFS
    IFS=:
    for dir in $PATH; do
        [ "$dir" = "$kit/path" ] || kept="${kept:+$kept:}$dir"
    done
    IFS=$old_ifs
    PATH=$kept
    export PATH
}

# A Python that can run our modules (3.9 or newer) and import the image's torch; silent when it cannot.
usable() {
    [ -n "$1" ] && "$1" -c 'import importlib.util as u, sys
sys.exit(0 if sys.version_info >= (3, 9) and u.find_spec("torch") else 1)' >/dev/null 2>&1
}

# The interpreter named on torchrun's first line (#!/path/python, or #!/usr/bin/env python3).
shebang_python() {
    script=$(command -v "$1") || return 1
    [ -f "$script" ] || return 1
    IFS= read -r line < "$script" || return 1
    case $line in "#!"*) ;; *) return 1 ;; esac
    set -- ${line#??}
    case ${1:-} in */env) shift ;; esac
    echo "${1:-}"
}

find_python() {
    for candidate in "$(shebang_python "${1:-torchrun}")" python3 python; do
        if usable "$candidate"; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

with_kit() {
    PYTHONPATH="$kit/lib${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
    exec "$@"
}

is_python() {
    case ${1##*/} in python | python3 | python3.*) return 0 ;; *) return 1 ;; esac
}

drop_kit_path
if [ "${0##*/}" = torchrun ]; then
    set -- torchrun "$@"
fi
case ${1:-} in
store)
    if python=$(find_python torchrun); then
        with_kit "$python" -m elasticjob_store
    fi
    say "no Python 3.9+ with torch found (torchrun's interpreter, python3, python); trying python"
    with_kit python -m elasticjob_store
    ;;
torchrun | */torchrun)
    program=$1
    shift
    if python=$(find_python "$program"); then
        with_kit "$python" -m elasticjob_warm.torchrun "$@"
    fi
    say "no Python 3.9+ with torch found (torchrun's interpreter, python3, python): plain torchrun, no warm starts"
    exec "$program" "$@"
    ;;
esac
if [ $# -ge 3 ] && is_python "$1" && [ "$2" = -m ]; then
    case $3 in torch.distributed.run | elasticjob_warm.torchrun)
        if usable "$1"; then
            python=$1
            shift 3
            with_kit "$python" -m elasticjob_warm.torchrun "$@"
        fi
        say "$1 is not a Python 3.9+ with torch: runs as written, no warm starts"
        ;;
    esac
fi
exec "$@"

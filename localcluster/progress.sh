# Sourced by build.sh and build_addons.sh: `go build` with progress lines on stderr.
# A cold build compiles a couple of thousand packages for several minutes; these lines say how far it has got.

_elapsed() { printf '%dm%02ds' $(((SECONDS - $1) / 60)) $(((SECONDS - $1) % 60)); }

# go_build_with_progress LABEL GO_BUILD_ARGS... -- PACKAGES...
# Runs `go build -v GO_BUILD_ARGS PACKAGES` and turns its package list into a count, a line per 100 packages
# or per 20 seconds, whichever comes first, and a heartbeat while nothing is printed (linking).
# Errors and `go: downloading` lines pass through unchanged.
go_build_with_progress() {
  local label=$1; shift
  local -a args=() packages=()
  while (($#)) && [[ $1 != -- ]]; do args+=("$1"); shift; done
  shift
  packages=("$@")
  local start=$SECONDS total
  echo "[$label] step 1/2: listing packages (downloads modules when the module cache is cold)" >&2
  total=$(go list -deps "${packages[@]}" | wc -l)
  echo "[$label] step 2/2: compiling (at most $total packages; those in the Go build cache are skipped), then linking" >&2
  go build -v "${args[@]}" "${packages[@]}" 2>&1 | {
    local n=0 last=$SECONDS line rc
    while :; do
      if IFS= read -r -t 20 line; then
        case $line in
          '' | *' '* | '#'*) echo "$line" >&2; continue ;;  # compiler errors, `go: downloading ...`
        esac
        n=$((n + 1))
        if ((n % 100 == 0 || SECONDS - last >= 20)); then
          echo "[$label] $(_elapsed "$start") compiled $n/$total packages ($line)" >&2
          last=$SECONDS
        fi
      else
        rc=$?
        ((rc > 128)) || break  # end of output
        [[ -n $line ]] && echo "$line" >&2
        echo "[$label] $(_elapsed "$start") compiled $n/$total packages; still working (linking or a large package)" >&2
        last=$SECONDS
      fi
    done
  }
  echo "[$label] built in $(_elapsed "$start")" >&2
}

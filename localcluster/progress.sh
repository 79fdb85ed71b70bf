# Sourced by build.sh and build_addons.sh: `go build` / `go install` with progress lines on stderr.
# A cold build compiles a couple of thousand packages for several minutes; these lines say how far it has got.

_elapsed() { printf '%dm%02ds' $(((SECONDS - $1) / 60)) $(((SECONDS - $1) % 60)); }

# go_progress LABEL START [TOTAL]
# Reads the output of `go build -v` / `go install -v` on stdin and turns its package list into a count, a line per
# 100 packages or per 20 seconds, whichever comes first, and a heartbeat while nothing is printed (downloading,
# linking). Errors and `go: downloading` lines pass through unchanged. Without TOTAL (a `go install pkg@version`,
# which `go list` cannot list) the count has no denominator.
go_progress() {
  local label=$1 start=$2 total=${3:+/$3} n=0 last=$SECONDS line rc
  while :; do
    if IFS= read -r -t 20 line; then
      case $line in
        '' | *' '* | '#'*) echo "$line" >&2; continue ;;  # compiler errors, `go: downloading ...`
      esac
      n=$((n + 1))
      if ((n % 100 == 0 || SECONDS - last >= 20)); then
        echo "[$label] $(_elapsed "$start") compiled $n$total packages ($line)" >&2
        last=$SECONDS
      fi
    else
      rc=$?
      ((rc > 128)) || break  # end of output
      [[ -n $line ]] && echo "$line" >&2
      echo "[$label] $(_elapsed "$start") compiled $n$total packages; still working (downloading, linking or a large package)" >&2
      last=$SECONDS
    fi
  done
}

# go_build_with_progress LABEL GO_BUILD_ARGS... -- PACKAGES...
# Runs `go build -v GO_BUILD_ARGS PACKAGES`, its progress as go_progress prints it.
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
  go build -v "${args[@]}" "${packages[@]}" 2>&1 | go_progress "$label" "$start" "$total"
  echo "[$label] built in $(_elapsed "$start")" >&2
}

# gpulab: an interactive shell (a JupyterLab terminal, `ssh -t`) says when the member's
# home is nearly full or full, before saving starts to fail (docs/members.md). Sourced by
# login shells from /etc/profile.
case $- in *i*) ;; *) return 0 2>/dev/null || exit 0 ;; esac
gpulab_home_df=$(df -P -B1 "$HOME" 2>/dev/null | awk 'NR == 2 { print $2, $4 }')
if [ -n "$gpulab_home_df" ]; then
  set -- $gpulab_home_df
  if [ "$1" -gt 0 ] && [ $(( $2 * 100 / $1 )) -lt 10 ]; then
    gpulab_used=$(numfmt --to=iec-i --suffix=B $(( $1 - $2 )))
    gpulab_size=$(numfmt --to=iec-i --suffix=B "$1")
    if [ "$2" -lt 1048576 ]; then
      echo "gpulab: your home ($HOME) is full: $gpulab_used of $gpulab_size used." >&2
      echo "gpulab: saving files and installing packages fail until you delete some" >&2
    else
      echo "gpulab: your home ($HOME) is nearly full: $gpulab_used of $gpulab_size used." >&2
      echo "gpulab: saving files and installing packages will fail once it is full" >&2
    fi
    echo "gpulab: (du -sh ~/* ~/.[!.]* | sort -h lists the largest last), or ask the lab's admins for more room." >&2
  fi
  set --
fi
unset gpulab_home_df gpulab_used gpulab_size

# gpulab: an interactive shell (a JupyterLab terminal, `ssh -t`) says when the member's
# home, or a project folder of her group's (/projects/NAME), is nearly full or full,
# before saving starts to fail (docs/members.md). Sourced by login shells from
# /etc/profile.
case $- in *i*) ;; *) return 0 2>/dev/null || exit 0 ;; esac
for gpulab_folder in "$HOME" /projects/*; do
  [ -d "$gpulab_folder" ] || continue
  gpulab_df=$(df -P -B1 "$gpulab_folder" 2>/dev/null | awk 'NR == 2 { print $2, $4 }')
  [ -n "$gpulab_df" ] || continue
  set -- $gpulab_df
  if [ "$1" -gt 0 ] && [ $(( $2 * 100 / $1 )) -lt 10 ]; then
    gpulab_used=$(numfmt --to=iec-i --suffix=B $(( $1 - $2 )))
    gpulab_size=$(numfmt --to=iec-i --suffix=B "$1")
    if [ "$gpulab_folder" = "$HOME" ]; then
      gpulab_what="your home ($HOME)" gpulab_fails="saving files and installing packages"
      gpulab_largest='du -sh ~/* ~/.[!.]* | sort -h'
    else
      gpulab_what="the project folder $gpulab_folder" gpulab_fails="saves and writes there"
      gpulab_largest="du -sh $gpulab_folder/* | sort -h"
    fi
    if [ "$2" -lt 1048576 ]; then
      echo "gpulab: $gpulab_what is full: $gpulab_used of $gpulab_size used." >&2
      echo "gpulab: $gpulab_fails fail until some are deleted" >&2
    else
      echo "gpulab: $gpulab_what is nearly full: $gpulab_used of $gpulab_size used." >&2
      echo "gpulab: $gpulab_fails will fail once it is full" >&2
    fi
    echo "gpulab: ($gpulab_largest lists the largest last), or ask the lab's admins for more room." >&2
  fi
  set --
done
unset gpulab_folder gpulab_df gpulab_used gpulab_size gpulab_what gpulab_fails gpulab_largest

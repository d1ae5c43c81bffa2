# packaging.rs's Debian 12 root, `sh -c` of this text under flock: CACHED PACKAGES MIRROR:
# makes CACHED with debootstrap unless it holds PACKAGES already (its .complete says so).
set -e
c=$1 p=$2 m=$3
[ "$(cat "$c/.complete" 2>/dev/null)" = "$p" ] && exit 0
rm -rf "$c.new"
debootstrap --variant=minbase --include="$p" bookworm "$c.new" "$m" >&2
echo "$p" >"$c.new/.complete"
rm -rf "$c"
mv "$c.new" "$c"

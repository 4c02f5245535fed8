#!/usr/bin/env bash
# Tags every published module of the repository at one version, in
# dependency order: the core first, then each module whose guardrail
# requirements are all tagged. Sub-directory modules get the tag names the
# go command expects (extra/prom/v0.1.0, cmd/guardrail/v0.1.0).
#
#   release/tag.sh v0.1.0          dry run: prints the git tag commands
#   release/tag.sh --push v0.1.0   creates the tags and pushes them
#
# It refuses a dirty tree, and checks that every go.mod requires its
# guardrail siblings at exactly that version. bench, integration and
# release are never published.
set -euo pipefail
cd "$(dirname "$0")/.."

push=0 version=""
for arg in "$@"; do
	case "$arg" in
	--push) push=1 ;;
	v*) version=$arg ;;
	*) echo "usage: release/tag.sh [--push] vX.Y.Z" >&2; exit 2 ;;
	esac
done
if ! [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "usage: release/tag.sh [--push] vX.Y.Z" >&2
	exit 2
fi

if [ -n "$(git status --porcelain)" ]; then
	echo "tag.sh: the working tree is dirty; commit or stash first:" >&2
	git status --short >&2
	exit 1
fi

prefix=github.com/guardrail-go/guardrail
# Published module directories, relative to the root ("." is the core).
dirs=(.)
for d in extra/*/ cmd/guardrail/; do
	[ -f "$d/go.mod" ] && dirs+=("${d%/}")
done

declare -A deps # dir -> space-separated guardrail requirement dirs
bad=0
for d in "${dirs[@]}"; do
	path=$(go mod edit -json "$d/go.mod" | sed -n 's/^[[:space:]]*"Path": "\(.*\)"$/\1/p' | head -n1)
	want=$prefix
	[ "$d" != . ] && want=$prefix/$d
	if [ "$path" != "$want" ]; then
		echo "tag.sh: $d/go.mod declares module $path, want $want" >&2
		bad=1
	fi
	if grep -q '^[[:space:]]*replace' "$d/go.mod"; then
		echo "tag.sh: $d/go.mod has a replace directive" >&2
		bad=1
	fi
	deps[$d]=""
	while read -r mod ver; do
		[ -z "$mod" ] && continue
		if [ "$ver" != "$version" ]; then
			echo "tag.sh: $d/go.mod requires $mod $ver, want $version" >&2
			bad=1
		fi
		sub=${mod#"$prefix"}
		sub=${sub#/}
		[ -z "$sub" ] && sub=.
		if [ ! -f "$sub/go.mod" ]; then
			echo "tag.sh: $d/go.mod requires $mod, which is not a module of this tree" >&2
			bad=1
		fi
		deps[$d]+=" $sub"
	done < <(go mod edit -json "$d/go.mod" | tr -d '\n\t ' | grep -o '{"Path":"[^"]*","Version":"[^"]*"' |
		sed 's/{"Path":"\([^"]*\)","Version":"\([^"]*\)"/\1 \2/' | grep "^$prefix[/ ]" || true)
done
[ "$bad" = 0 ] || exit 1

tagname() { if [ "$1" = . ]; then echo "$version"; else echo "$1/$version"; fi; }

declare -A done_
order=()
while [ "${#order[@]}" -lt "${#dirs[@]}" ]; do
	progress=0
	for d in "${dirs[@]}"; do
		[ -n "${done_[$d]:-}" ] && continue
		ready=1
		for r in ${deps[$d]}; do
			[ -n "${done_[$r]:-}" ] || ready=0
		done
		if [ "$ready" = 1 ]; then
			order+=("$d")
			done_[$d]=1
			progress=1
		fi
	done
	if [ "$progress" = 0 ]; then
		echo "tag.sh: the guardrail requirements form a cycle" >&2
		exit 1
	fi
done

for d in "${order[@]}"; do
	t=$(tagname "$d")
	if git rev-parse -q --verify "refs/tags/$t" >/dev/null; then
		echo "tag.sh: tag $t already exists" >&2
		exit 1
	fi
done

commit=$(git rev-parse HEAD)
tags=()
for d in "${order[@]}"; do
	t=$(tagname "$d")
	tags+=("$t")
	if [ "$push" = 1 ]; then
		git tag -a "$t" -m "$t" "$commit"
		echo "tagged $t"
	else
		echo "git tag -a $t -m $t $commit"
	fi
done
if [ "$push" = 1 ]; then
	git push origin "${tags[@]}"
else
	echo "git push origin ${tags[*]}"
	echo "(dry run; rerun with --push to tag)"
fi

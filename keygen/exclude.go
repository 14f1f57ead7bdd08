package keygen

import (
	"strings"

	"github.com/oncemill/oncemill/internal/configerr"
)

// exclusions decides which object members ContentHash leaves out.
//
// A plain name ("sent_at") removes a member of that name in every object at
// any depth, including objects inside arrays. A dotted path ("meta.sent_at")
// removes exactly that member, reached from the root through objects only:
// it never descends into arrays. Names are matched against the decoded
// member name, so "sent\u005fat" in the payload is "sent_at".
type exclusions struct {
	names map[string]struct{}
	root  *pathNode // nil when there are no dotted paths
}

// pathNode is one level of the dotted paths, a trie keyed by member name.
type pathNode struct {
	children map[string]*pathNode
	// leaf: the path ends here, the member is removed (and with it
	// anything longer paths would have removed below it).
	leaf bool
}

func newExclusions(exclude []string) (exclusions, error) {
	var ex exclusions
	for _, e := range exclude {
		if e == "" {
			return exclusions{}, configerr.New("ContentHashOptions.Exclude", "an empty entry; name each field to exclude")
		}
		if !strings.Contains(e, ".") {
			if ex.names == nil {
				ex.names = make(map[string]struct{})
			}
			ex.names[e] = struct{}{}
			continue
		}
		segments := strings.Split(e, ".")
		for _, s := range segments {
			if s == "" {
				return exclusions{}, configerr.New("ContentHashOptions.Exclude", "path %q has an empty segment; write a dotted path such as meta.sentAt", e)
			}
		}
		if ex.root == nil {
			ex.root = &pathNode{}
		}
		n := ex.root
		for _, s := range segments {
			c := n.children[s]
			if c == nil {
				if n.children == nil {
					n.children = make(map[string]*pathNode)
				}
				c = &pathNode{}
				n.children[s] = c
			}
			n = c
		}
		n.leaf = true
	}
	return ex, nil
}

// member reports whether the member name in an object at path is removed,
// and if not, the path node to use for its value (nil: no dotted path
// continues below it).
func (ex *exclusions) member(path *pathNode, name []byte) (excluded bool, child *pathNode) {
	if ex.names != nil {
		if _, ok := ex.names[string(name)]; ok {
			return true, nil
		}
	}
	if path == nil {
		return false, nil
	}
	child = path.children[string(name)]
	if child != nil && child.leaf {
		return true, nil
	}
	return false, child
}

package series

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Other is the value a label takes once its cap of distinct values is
// reached, and for values that are not fit to be labels at all.
const Other = "other"

// DefaultMaxValues is the default cap of distinct values per label.
const DefaultMaxValues = 100

// MaxValueLen is the longest label value kept; a longer one is almost
// certainly a raw path or a message, not a name, and becomes Other.
const MaxValueLen = 128

// Folder bounds the distinct values of one label: the first max values it
// sees are kept, every later new value becomes Other. Values longer than
// MaxValueLen or not valid UTF-8 become Other at once. A Folder is safe for
// concurrent use.
type Folder struct {
	max  int // < 0: no cap
	mu   sync.Mutex
	seen map[string]string // value -> the Folder's own copy of it
}

// NewFolder returns a Folder keeping at most max values; zero means
// DefaultMaxValues, negative means no cap.
func NewFolder(max int) *Folder {
	if max == 0 {
		max = DefaultMaxValues
	}
	return &Folder{max: max, seen: make(map[string]string)}
}

// Fold returns v if it is, or can become, one of the kept values, else
// Other. The string returned for a kept value is the Folder's own copy, so
// a label never pins the memory of a larger user string.
func (f *Folder) Fold(v string) string {
	if v == Other {
		return Other
	}
	if len(v) > MaxValueLen || !utf8.ValidString(v) {
		return Other
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if kept, ok := f.seen[v]; ok {
		return kept
	}
	if f.max >= 0 && len(f.seen) >= f.max {
		return Other
	}
	kept := strings.Clone(v)
	f.seen[kept] = kept
	return kept
}

// Len returns the number of values kept.
func (f *Folder) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

// Folders holds one Folder per label name, all with the same cap. Folders
// is safe for concurrent use.
type Folders struct {
	max int
	mu  sync.Mutex
	m   map[string]*Folder
}

// NewFolders returns Folders whose Folder each keep max values (see
// NewFolder).
func NewFolders(max int) *Folders {
	return &Folders{max: max, m: make(map[string]*Folder)}
}

// For returns the Folder of label name.
func (fs *Folders) For(name string) *Folder {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.m[name]
	if f == nil {
		f = NewFolder(fs.max)
		fs.m[name] = f
	}
	return f
}

// key holds up to four label values; unused positions are empty.
type key [4]string

// Cache maps raw label values to a V built once per distinct combination
// of folded values (a metric child, an attribute set). Get on a combination
// seen before reads an immutable hash table through one atomic load, takes
// no lock and allocates nothing; adding a combination copies the table
// under a mutex, which happens at most once per exported series. Raw
// values that fold to Other are never stored, so the cache holds at most
// one entry per exported series however many raw values arrive. A Cache is
// safe for concurrent use.
type Cache[V any] struct {
	folders []*Folder
	build   func(labelValues []string) V
	seed    maphash.Seed
	table   atomic.Pointer[table[V]]
	mu      sync.Mutex // serialises inserts
}

// table is an open-addressing hash table with linear probing, never
// modified once published. len(slots) is a power of two, at least twice
// the number of entries.
type table[V any] struct {
	slots []*entry[V]
	n     int
}

type entry[V any] struct {
	k    key
	hash uint64
	v    V
}

// NewCache returns a Cache for the labels of d, folded by fs, whose values
// are made by build from the folded label values (len(d.Labels) of them).
func NewCache[V any](d *Def, fs *Folders, build func(labelValues []string) V) *Cache[V] {
	if len(d.Labels) > len(key{}) {
		panic("series: " + d.Name + " has too many labels")
	}
	c := &Cache[V]{build: build, seed: maphash.MakeSeed()}
	for _, l := range d.Labels {
		c.folders = append(c.folders, fs.For(l))
	}
	c.table.Store(&table[V]{slots: make([]*entry[V], 8)})
	return c
}

func (c *Cache[V]) hash(k *key) uint64 {
	h := maphash.String(c.seed, k[0])
	for _, s := range k[1:] {
		if s != "" {
			h = h*31 ^ maphash.String(c.seed, s)
		}
	}
	return h
}

func (t *table[V]) find(k *key, h uint64) (V, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := t.slots[i]
		if e == nil {
			var zero V
			return zero, false
		}
		if e.hash == h && e.k == *k {
			return e.v, true
		}
	}
}

// Get returns the V of the label values; pass "" for positions past the
// series' labels.
func (c *Cache[V]) Get(a, b, cc, d string) V {
	k := key{a, b, cc, d}
	if v, ok := c.table.Load().find(&k, c.hash(&k)); ok {
		return v
	}
	return c.slow(k)
}

func (c *Cache[V]) slow(k key) V {
	var f key
	for i, fo := range c.folders {
		f[i] = fo.Fold(k[i])
	}
	h := c.hash(&f)
	if v, ok := c.table.Load().find(&f, h); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.table.Load()
	if v, ok := t.find(&f, h); ok {
		return v
	}
	v := c.build(f[:len(c.folders)])
	size := len(t.slots)
	if 2*(t.n+1) > size {
		size *= 2
	}
	nt := &table[V]{slots: make([]*entry[V], size), n: t.n + 1}
	for _, e := range t.slots {
		if e != nil {
			nt.insert(e)
		}
	}
	nt.insert(&entry[V]{k: f, hash: h, v: v})
	c.table.Store(nt)
	return v
}

func (t *table[V]) insert(e *entry[V]) {
	mask := uint64(len(t.slots) - 1)
	i := e.hash & mask
	for t.slots[i] != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = e
}

// Range calls fn with the folded label values and V of every entry.
func (c *Cache[V]) Range(fn func(labelValues []string, v V)) {
	n := len(c.folders)
	for _, e := range c.table.Load().slots {
		if e != nil {
			fn(e.k[:n], e.v)
		}
	}
}

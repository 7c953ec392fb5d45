package dl

import "sync"

// Cache keeps one opened library value per path for the life of the
// process: the vendor backends' SharedLibrary. A failed open is not
// remembered, so a later call tries again; nothing in it is ever closed
// (vendor drivers do not like dlclose). The zero value is ready to use.
type Cache[L comparable] struct {
	mu     sync.Mutex
	byPath map[string]L
}

// Get returns the library opened for path, opening it with open the first
// time.
func (c *Cache[L]) Get(path string, open func(string) (L, error)) (L, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.byPath[path]; ok {
		return l, nil
	}
	l, err := open(path)
	if err != nil {
		return l, err
	}
	if c.byPath == nil {
		c.byPath = map[string]L{}
	}
	c.byPath[path] = l
	return l, nil
}

// Forget drops l wherever it is cached (a library being closed).
func (c *Cache[L]) Forget(l L) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.byPath {
		if v == l {
			delete(c.byPath, k)
		}
	}
}

// Package collide is the root package of a module with a directory of the
// same name: both would be listed in collide.txt.
package collide

// Root is exported.
func Root() {}

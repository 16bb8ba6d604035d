// Package collide is in the directory named like its module's root.
package collide

// Inner is exported.
func Inner() {}

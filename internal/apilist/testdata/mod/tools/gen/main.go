// Command gen is a main package outside cmd/: it has no listing.
package main

func main() {}

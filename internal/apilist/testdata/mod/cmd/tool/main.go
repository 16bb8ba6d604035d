// Command tool is a command: it has no listing.
package main

func main() {}

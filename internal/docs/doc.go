// Package docs holds no code: its test checks the repository's documents
// against the code, so that ARCHITECTURE.md and docs/ cannot drift into
// naming functions and files that do not exist, or linking to nothing.
package docs

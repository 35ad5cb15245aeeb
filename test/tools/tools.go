// Package tools pins the upstream control-plane commands that test/ and local mode run.
// They are declared with go.mod's tool directive; this file only gives the module a package.
package tools

// Package setup tests the pieces behind the README's two set-up commands,
// `make demo` and `make test`: hack/install-deps.sh, the pinned tools of
// `make tools` and hack/build-apiserver.sh's progress lines. It has no code
// of its own.
package setup

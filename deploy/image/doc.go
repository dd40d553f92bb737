// Package image holds the checks on keyward's container image that need no
// container engine (image_test.go): the binary built by the Dockerfile's own
// script, hack/build-release.sh, and the Dockerfile's stages. See
// docs/development.md, "Container image", for what they prove and what they
// cannot.
package image

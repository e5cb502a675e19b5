// Package k8stest checks the Kubernetes manifests of a deployment bundle
// (internal/deploy) with the Kubernetes API types: every manifest decodes
// strictly into k8s.io/api objects, and the objects agree with each other
// (replicas, probes, mounts, secret references, the peers list). It is a
// module of its own, so that the main module does not depend on the
// Kubernetes libraries; its import path lies under the main module's, so
// it may import internal/deploy.
package k8stest

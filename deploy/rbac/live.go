package rbac

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// ProveApplied proves checks against a live kube-apiserver on which the RBAC
// objects applied were just created, then deletes them and proves that every
// grant went with them, so that the next caller starts from nothing. The
// RBAC authorizer reads through a cache, so each proof is asked again every
// 200ms for up to 30s (a wrong grant never becomes right by waiting). It
// returns what did not hold: checks the authorizer answered differently,
// objects it could not delete, grants that outlived their deletion.
func ProveApplied(ctx context.Context, client kubernetes.Interface, checks []Check, applied []*unstructured.Unstructured) error {
	var errs []error
	if err := proveEventually(ctx, client, checks); err != nil {
		errs = append(errs, fmt.Errorf("RBAC differs from its expectations:\n%w", err))
	}
	if err := deleteObjects(ctx, client, applied); err != nil {
		return errors.Join(append(errs, err)...)
	}
	var gone []Check
	for _, c := range checks {
		if c.Allowed {
			c.Allowed = false
			gone = append(gone, c)
		}
	}
	if err := proveEventually(ctx, client, gone); err != nil {
		errs = append(errs, fmt.Errorf("the grants outlived their deletion:\n%w", err))
	}
	return errors.Join(errs...)
}

// proveEventually runs Prove every 200ms until it holds or 30s pass, and
// returns the last answer given before the deadline.
func proveEventually(ctx context.Context, client kubernetes.Interface, checks []Check) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		err := Prove(ctx, client, checks)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// deleteObjects deletes the ServiceAccounts, (Cluster)Roles and
// (Cluster)RoleBindings among objs; other kinds are left alone.
func deleteObjects(ctx context.Context, c kubernetes.Interface, objs []*unstructured.Unstructured) error {
	var errs []error
	for _, o := range objs {
		var err error
		n, ns := o.GetName(), o.GetNamespace()
		switch o.GetKind() {
		case "ServiceAccount":
			err = c.CoreV1().ServiceAccounts(ns).Delete(ctx, n, metav1.DeleteOptions{})
		case "ClusterRole":
			err = c.RbacV1().ClusterRoles().Delete(ctx, n, metav1.DeleteOptions{})
		case "ClusterRoleBinding":
			err = c.RbacV1().ClusterRoleBindings().Delete(ctx, n, metav1.DeleteOptions{})
		case "Role":
			err = c.RbacV1().Roles(ns).Delete(ctx, n, metav1.DeleteOptions{})
		case "RoleBinding":
			err = c.RbacV1().RoleBindings(ns).Delete(ctx, n, metav1.DeleteOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", o.GetKind(), n, err))
		}
	}
	return errors.Join(errs...)
}

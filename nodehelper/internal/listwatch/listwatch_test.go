package listwatch

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

func TestListAndWatchGetTheSelectorsAndOnlyConsistentListsDropTheResourceVersion(t *testing.T) {
	cases := []struct {
		name     string
		build    func(list func(context.Context, metav1.ListOptions) (*corev1.NodeList, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error), sel func(*metav1.ListOptions)) *cache.ListWatch
		wantList metav1.ListOptions
	}{
		{
			name:     "a plain list keeps the reflector's resource version",
			build:    For[*corev1.NodeList],
			wantList: metav1.ListOptions{FieldSelector: "metadata.name=n", ResourceVersion: "0", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
		},
		{
			name:     "a consistent list reads from etcd",
			build:    Consistent[*corev1.NodeList],
			wantList: metav1.ListOptions{FieldSelector: "metadata.name=n"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var listed, watched metav1.ListOptions
			lw := tc.build(
				func(_ context.Context, o metav1.ListOptions) (*corev1.NodeList, error) {
					listed = o
					return &corev1.NodeList{}, nil
				},
				func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
					watched = o
					return watch.NewFake(), nil
				},
				func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=n" },
			)
			ctx := context.Background()
			if _, err := lw.ListWithContext(ctx, metav1.ListOptions{ResourceVersion: "0", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}); err != nil {
				t.Fatal(err)
			}
			if _, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "7"}); err != nil {
				t.Fatal(err)
			}
			if listed != tc.wantList {
				t.Errorf("list options %+v, want %+v", listed, tc.wantList)
			}
			if want := (metav1.ListOptions{FieldSelector: "metadata.name=n", ResourceVersion: "7"}); watched != want {
				t.Errorf("watch options %+v, want %+v", watched, want)
			}
		})
	}
}

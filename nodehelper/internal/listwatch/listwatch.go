// Package listwatch builds the cache.ListWatch of a typed client with the
// same selectors on its list and its watch.
package listwatch

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// For returns a ListWatch whose list and watch set their selectors first.
func For[L runtime.Object](
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
	selectors func(*metav1.ListOptions),
) *cache.ListWatch {
	return build(list, watchFn, selectors, false)
}

// Consistent is For whose list is a consistent read, not the watch cache's
// "any" (the reflector's resourceVersion 0), which may predate an object
// just created: absence from the list then means the object is gone.
func Consistent[L runtime.Object](
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
	selectors func(*metav1.ListOptions),
) *cache.ListWatch {
	return build(list, watchFn, selectors, true)
}

func build[L runtime.Object](
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
	selectors func(*metav1.ListOptions),
	consistent bool,
) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			selectors(&o)
			if consistent {
				o.ResourceVersion, o.ResourceVersionMatch = "", ""
			}
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			selectors(&o)
			return watchFn(ctx, o)
		},
	}
}

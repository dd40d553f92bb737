package controlplane

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// WriteKubeconfig writes cfg (a config returned by this package, or one
// with a bearer token) as a kubeconfig file at path, readable only by its
// owner.
func WriteKubeconfig(cfg *rest.Config, user, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["keyward-test"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts[user+"@keyward-test"] = &clientcmdapi.Context{Cluster: "keyward-test", AuthInfo: user}
	kc.CurrentContext = user + "@keyward-test"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

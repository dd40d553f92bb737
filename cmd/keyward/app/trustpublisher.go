package app

import (
	"context"
	"fmt"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/trustpublisher"
)

// TrustPublisherCompanion runs the trust publisher for the signer's names
// while the signer leads (a controller built anew each term), or nothing
// when cfg disables it. The signer and the trust publisher never import
// each other; this is where they are put side by side.
func TrustPublisherCompanion(cfg *config.SignerConfiguration) []signer.Companion {
	return trustPublisherCompanions(cfg.TrustPublisher)
}

// trustPublisherCompanions runs the trust publisher for the leading
// process's signer names (LeadEnv.SignerNames), unless tp disables it;
// the signer and the token service share it.
func trustPublisherCompanions(tp config.TrustPublisher) []signer.Companion {
	if tp.Enabled != nil && !*tp.Enabled {
		return nil
	}
	return []signer.Companion{func(ctx context.Context, env signer.LeadEnv) error {
		auths, err := authclient.New(env.RestConfig)
		if err != nil {
			return err
		}
		c, err := trustpublisher.New(trustpublisher.Options{
			Client: env.Client, Authorities: auths, SignerNames: env.SignerNames,
			Recorder: env.NewRecorder("keyward-trustpublisher"), Metrics: env.Metrics,
			KubeletSyncFrequency: tp.KubeletSyncFrequency.Duration,
			Witness:              env.Witness,
		})
		if err != nil {
			return fmt.Errorf("building the trust publisher: %w", err)
		}
		if err := c.Run(ctx); err != nil {
			return fmt.Errorf("running the trust publisher: %w", err)
		}
		return nil
	}}
}

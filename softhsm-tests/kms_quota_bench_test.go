package softhsmtests

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/testsupport/awskmsfake"
)

// kmsQuota is the AWS KMS fake's Sign quota in BenchmarkKMSQuota, per
// second (burst: one second's worth): far below AWS's published ECC
// quotas, so that the quota, not this machine's apiserver, bounds
// issuance signed by the KMS key.
const kmsQuota = 50

// BenchmarkKMSQuota: N PCRs created as fast as they go (16 pods on 4
// nodes, as BenchmarkPCRThroughput) for a signer whose CA key is in the
// AWS KMS fake, throttled to kmsQuota Sign calls a second (ThrottlingException
// beyond, as AWS answers) with 20 ms per call. Once with
// signers[].intermediate off (every leaf is a KMS signature), once with it
// on (one KMS signature, then leaves signed in memory); the bare
// create+status ceiling (BenchmarkPCRThroughput's) before and after, in the
// same run on the same apiserver. The signer's settings are the shipped
// defaults but workers (config.WorkersFor, as the awskms-20ms round) and
// the KMS retry policy (backends.awskms defaults: 5 attempts, the SDK's
// retry-token bucket).
//
//	off-PCR/s          issuance rate, intermediate off (bound by the quota)
//	off-KMS-signs/s    KMS signatures per second that run made (≤ kmsQuota)
//	on-PCR/s           issuance rate, intermediate on
//	on-KMS-signs       KMS signatures that run made (1: the intermediate)
//	bare-PCR/s         the ceiling, mean of its runs before and after
//	on-of-off          on-PCR/s ÷ off-PCR/s
//	on-of-bare         on-PCR/s ÷ bare-PCR/s
func BenchmarkKMSQuota(b *testing.B) {
	n := benchN(b)
	ctx := benchContext(b)
	kms := awskmsfake.Start(awskmsfake.Options{SignRate: kmsQuota})
	b.Cleanup(kms.Close)
	var opts all.Options
	opts.AWSKMS.Config = &aws.Config{Credentials: credentials.NewStaticCredentialsProvider(awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey, "")}

	// Both CAs are made before the latency is added: only issuance pays it.
	type mode struct {
		name string
		cfg  *config.SignerConfiguration
	}
	var modes []mode
	for _, on := range []bool{false, true} {
		m := mode{name: "off"}
		suffix := uniqueName(b, "quota")
		signerName := "keyward.dev/quota-" + suffix
		keyURI, caFile, _ := newCAPathLen(b, opts, kmsURI(kms), "ca-"+suffix, 1)
		sc := signerConfig(b, signerName, config.ProfilePodIdentity, keyURI, caFile)
		if on {
			m.name = "on"
			sc.Intermediate = &config.Intermediate{Enabled: true}
		}
		m.cfg = baseConfig(b, sc)
		m.cfg.Workers = config.WorkersFor(kmsBenchPeakRate, kmsBenchLatency)
		modes = append(modes, m)
	}
	kms.SetLatency(kmsBenchLatency)

	before, _ := bareRate(b, ctx, modes[0].cfg, n)
	rates, signs := map[string]float64{}, map[string]int{}
	var offSeconds float64
	for _, m := range modes {
		// A full quota bucket for each run.
		time.Sleep(time.Second)
		rate, elapsed, s := quotaRun(b, ctx, kms, opts, m.cfg, "quota-"+m.name, n)
		rates[m.name], signs[m.name] = rate, s
		if m.name == "off" {
			offSeconds = elapsed.Seconds()
		}
	}
	after, _ := bareRate(b, ctx, modes[0].cfg, n)
	bare := (before + after) / 2

	b.ReportMetric(rates["off"], "off-PCR/s")
	b.ReportMetric(float64(signs["off"])/offSeconds, "off-KMS-signs/s")
	b.ReportMetric(rates["on"], "on-PCR/s")
	b.ReportMetric(float64(signs["on"]), "on-KMS-signs")
	b.ReportMetric(bare, "bare-PCR/s")
	b.ReportMetric(rates["on"]/rates["off"], "on-of-off")
	b.ReportMetric(rates["on"]/bare, "on-of-bare")
	b.Logf("KMS quota %d/s: %d PCRs, intermediate off %.0f PCR/s (%d KMS signatures), on %.0f PCR/s (%d), bare ceiling %.0f PCR/s; %d Sign calls throttled in all",
		kmsQuota, n, rates["off"], signs["off"], rates["on"], signs["on"], bare, kms.Throttled())
}

// quotaRun runs a signer with cfg, has a fleet create n PCRs as fast as it
// goes, and returns the issuance rate (first Create → last Issued seen on
// a watch), the time that took, and how many signatures the KMS made
// meanwhile (readiness probes included: the signer probes a key that has
// failed, at most every 10 s). The signer is stopped before it returns.
func quotaRun(b *testing.B, ctx context.Context, kms *awskmsfake.Server, opts all.Options, cfg *config.SignerConfiguration, identity string, n int) (float64, time.Duration, int) {
	rs := runSignerWith(b, cfg, identity, pcr.V1, opts)
	defer rs.Stop()
	signerName := cfg.Signers[0].Name
	fleet := newFleet(b, ctx, signerName)
	signed := len(kms.SignRequests())
	iw := watchIssued(b, ctx, signerName, n)
	start := time.Now()
	parallel(n, benchCreators, func(i int) {
		if _, err := fleet.create(ctx, i); err != nil {
			b.Error(err)
		}
	})
	iw.wait(b, 10*time.Minute)
	elapsed := time.Since(start)
	return float64(n) / elapsed.Seconds(), elapsed, len(kms.SignRequests()) - signed
}

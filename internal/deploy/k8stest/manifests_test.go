package k8stest

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	kyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/ticketing-dev/ticketing/internal/deploy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// objects are the decoded manifests of a bundle.
type objects struct {
	secrets     map[string]*corev1.Secret
	configMaps  map[string]*corev1.ConfigMap
	services    map[string]*corev1.Service
	sets        []*appsv1.StatefulSet
	pdbs        []*policyv1.PodDisruptionBudget
	files       []string // manifest files decoded
	kustomized  []string // kustomization.yaml's resources
	secretFiles map[string]bool
}

// decodeBundle decodes every manifest of b strictly (unknown or duplicate
// fields fail) into the Kubernetes API types.
func decodeBundle(t *testing.T, b *deploy.Bundle) objects {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ser := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
	o := objects{secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{},
		services: map[string]*corev1.Service{}, secretFiles: map[string]bool{}}
	for _, f := range b.Files {
		dir, name := path.Split(f.Path)
		if dir != deploy.KubeDir+"/" || f.Mode.IsDir() {
			continue
		}
		if name == "kustomization.yaml" {
			var k struct {
				APIVersion string   `yaml:"apiVersion"`
				Kind       string   `yaml:"kind"`
				Resources  []string `yaml:"resources"`
			}
			dec := yaml.NewDecoder(bytes.NewReader(f.Data))
			dec.KnownFields(true)
			if err := dec.Decode(&k); err != nil || k.Kind != "Kustomization" {
				t.Fatalf("%s: %v (kind %q)", f.Path, err, k.Kind)
			}
			o.kustomized = k.Resources
			continue
		}
		o.files = append(o.files, name)
		if f.Secret {
			o.secretFiles[name] = true
		}
		r := kyaml.NewYAMLReader(bufioReader(f.Data))
		for {
			doc, err := r.Read()
			if err != nil {
				break
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, gvk, err := ser.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: strict decode: %v\n%s", f.Path, err, doc)
			}
			switch v := obj.(type) {
			case *corev1.Secret:
				o.secrets[v.Name] = v
			case *corev1.ConfigMap:
				o.configMaps[v.Name] = v
			case *corev1.Service:
				o.services[v.Name] = v
			case *appsv1.StatefulSet:
				o.sets = append(o.sets, v)
			case *policyv1.PodDisruptionBudget:
				o.pdbs = append(o.pdbs, v)
			default:
				t.Fatalf("%s: unexpected %v", f.Path, gvk)
			}
		}
	}
	return o
}

var varRef = regexp.MustCompile(`\$\(([A-Z_]+)\)`)

func TestManifests(t *testing.T) {
	cluster := func(n int, tls deploy.TLSMode, peerTLS bool, ns string) deploy.Spec {
		s := deploy.DefaultSpec(deploy.Cluster)
		s.TLS, s.PeerTLS = tls, peerTLS
		for i := range n {
			s.Nodes = append(s.Nodes, deploy.Node{ID: fmt.Sprintf("m%d", i), Host: fmt.Sprintf("10.0.0.%d", i+1)})
		}
		s.Kubernetes = &deploy.Kubernetes{Namespace: ns, Image: "registry.example/ticketingd:1.0"}
		return s
	}
	single := deploy.DefaultSpec(deploy.Single)
	single.AdminToken, single.TLS, single.Hosts = true, deploy.TLSPrivateCA, []string{"locks.example"}
	single.Kubernetes = &deploy.Kubernetes{}
	singlePlain := deploy.DefaultSpec(deploy.Single)
	singlePlain.AdminToken = true
	singlePlain.Kubernetes = &deploy.Kubernetes{Namespace: "locks"}
	for name, s := range map[string]deploy.Spec{
		"cluster3":       cluster(3, deploy.TLSPrivateCA, true, "prod"),
		"cluster5-plain": cluster(5, deploy.TLSOff, false, "default"),
		"single-tls":     single,
		"single-plain":   singlePlain,
	} {
		t.Run(name, func(t *testing.T) {
			s.Dir = t.TempDir()
			b, err := deploy.Plan(s)
			if err != nil {
				t.Fatal(err)
			}
			checkBundle(t, s, b)
		})
	}
}

func checkBundle(t *testing.T, s deploy.Spec, b *deploy.Bundle) {
	o := decodeBundle(t, b)
	ns := s.Kubernetes.Namespace
	if ns == "" {
		ns = deploy.DefaultKubeNamespace
	}
	isCluster := s.Topology == deploy.Cluster
	wantReplicas := 1
	if isCluster {
		wantReplicas = len(s.Nodes)
	}
	slices.Sort(o.files)
	kust := slices.Clone(o.kustomized)
	slices.Sort(kust)
	if !slices.Equal(o.files, kust) {
		t.Errorf("kustomization.yaml lists %v, the manifests are %v", kust, o.files)
	}
	if len(o.sets) != 1 {
		t.Fatalf("%d StatefulSets, want 1", len(o.sets))
	}
	sts := o.sets[0]
	for _, m := range []interface{ GetNamespace() string }{sts} {
		if m.GetNamespace() != ns {
			t.Errorf("namespace %q, want %q", m.GetNamespace(), ns)
		}
	}
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != wantReplicas {
		t.Errorf("replicas %v, want %d", sts.Spec.Replicas, wantReplicas)
	}
	if isCluster && sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: a new cluster bootstraps only once every node answers, so its pods must start together", sts.Spec.PodManagementPolicy)
	}
	podLabels := sts.Spec.Template.Labels
	if !matches(sts.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("StatefulSet selector %v does not match its pods' labels %v", sts.Spec.Selector.MatchLabels, podLabels)
	}

	// The headless Service names the pods: before they are ready too, for
	// a cluster's bootstrap.
	hl := o.services[sts.Spec.ServiceName]
	if hl == nil || hl.Spec.ClusterIP != corev1.ClusterIPNone || !hl.Spec.PublishNotReadyAddresses {
		t.Fatalf("serviceName %q: want a headless Service publishing not-ready addresses, got %+v", sts.Spec.ServiceName, hl)
	}
	var client *corev1.Service
	for _, svc := range o.services {
		if !matches(svc.Spec.Selector, podLabels) || svc.Namespace != ns {
			t.Errorf("Service %s: selector %v does not match the pods %v (or namespace %q)", svc.Name, svc.Spec.Selector, podLabels, svc.Namespace)
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			client = svc
		}
	}
	if client == nil {
		t.Fatal("no client Service")
	}

	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != s.Kubernetes.Image && (s.Kubernetes.Image != "" || c.Image != deploy.DefaultKubeImage) {
		t.Errorf("image %q, want %q", c.Image, s.Kubernetes.Image)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, svc := range o.services {
		for _, p := range svc.Spec.Ports {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service %s port %s: targetPort %q is no container port", svc.Name, p.Name, p.TargetPort.StrVal)
			}
		}
	}

	// The env the args refer to, and where it comes from.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, a := range c.Args {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if _, ok := env[m[1]]; !ok {
				t.Errorf("arg %q refers to $(%s), which the container's env lacks", a, m[1])
			}
		}
	}
	// A value from the Secret goes into a flag as it is: no newline.
	for _, e := range c.Env {
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && o.secrets[r.SecretKeyRef.Name] != nil {
			if v := o.secrets[r.SecretKeyRef.Name].StringData[r.SecretKeyRef.Key]; v != strings.TrimSpace(v) || v == "" {
				t.Errorf("env %s from Secret key %s: %q, want a value without spaces or newlines around it", e.Name, r.SecretKeyRef.Key, v)
			}
		}
	}
	if e := env["POD_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POD_NAME: want the downward API's metadata.name, got %+v", e)
	}

	// Secret references resolve to Secrets of the bundle, with the key.
	secretHas := func(what, name, key string) {
		t.Helper()
		sec := o.secrets[name]
		if sec == nil {
			t.Errorf("%s: no Secret %q in the bundle", what, name)
			return
		}
		if _, ok := sec.StringData[key]; !ok && key != "" {
			t.Errorf("%s: Secret %q has no key %q", what, name, key)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secretHas("env "+e.Name, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		switch {
		case v.Secret != nil:
			secretHas("volume "+v.Name, v.Secret.SecretName, "")
		case v.ConfigMap != nil:
			if o.configMaps[v.ConfigMap.Name] == nil {
				t.Errorf("volume %s: no ConfigMap %q in the bundle", v.Name, v.ConfigMap.Name)
			}
		}
	}
	claims := map[string]bool{}
	for _, ct := range sts.Spec.VolumeClaimTemplates {
		claims[ct.Name] = true
		if _, ok := ct.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
			t.Errorf("volumeClaimTemplate %s requests no storage", ct.Name)
		}
	}
	mounts := map[string]corev1.VolumeMount{} // by volume
	for _, m := range c.VolumeMounts {
		// No mount inside another: the runtime would have to make its
		// directory in a read-only ConfigMap or Secret volume.
		for _, m2 := range c.VolumeMounts {
			if m2.Name != m.Name && strings.HasPrefix(m.MountPath+"/", m2.MountPath+"/") {
				t.Errorf("mount %s (%s) is inside mount %s (%s)", m.Name, m.MountPath, m2.Name, m2.MountPath)
			}
		}
		if _, ok := volumes[m.Name]; !ok && !claims[m.Name] {
			t.Errorf("mount %s: no volume or volumeClaimTemplate of that name", m.Name)
		}
		mounts[m.Name] = m
	}

	// The config: from the ConfigMap mounted where --config reads it.
	cfgPath := argAfter(c.Args, "--config")
	var cfgMount *corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if v, ok := volumes[m.Name]; ok && v.ConfigMap != nil && path.Dir(cfgPath) == m.MountPath {
			cfgMount = &m
		}
	}
	if cfgMount == nil {
		t.Fatalf("--config %s is in no ConfigMap volume's mount", cfgPath)
	}
	cm := o.configMaps[volumes[cfgMount.Name].ConfigMap.Name]
	var cfg deploy.Config
	dec := yaml.NewDecoder(strings.NewReader(cm.Data[path.Base(cfgPath)]))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("config %s in ConfigMap %s: %v", path.Base(cfgPath), cm.Name, err)
	}

	// The data dir is on the pod's volume claim.
	dataMount := ""
	for _, m := range c.VolumeMounts {
		if claims[m.Name] {
			dataMount = m.MountPath
		}
	}
	if dataMount == "" || !strings.HasPrefix(cfg.DataDir, dataMount+"/") && cfg.DataDir != dataMount {
		t.Errorf("data-dir %q is not on a volume claim (mounted at %q)", cfg.DataDir, dataMount)
	}

	// Probes: GET /healthz on the admin listener's port.
	_, adminPort, err := net.SplitHostPort(cfg.AdminListen)
	if err != nil || cfg.AdminListen[0] != ':' {
		t.Fatalf("admin-listen %q: want all interfaces, for the kubelet's probes", cfg.AdminListen)
	}
	for what, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != "/healthz" {
			t.Errorf("%s probe: want GET /healthz, got %+v", what, pr)
			continue
		}
		if got := strconv.Itoa(int(ports[pr.HTTPGet.Port.StrVal])); got != adminPort {
			t.Errorf("%s probe on port %q (%s), admin-listen is %s", what, pr.HTTPGet.Port.StrVal, got, cfg.AdminListen)
		}
	}
	_, clientPort, _ := net.SplitHostPort(cfg.Listen)
	if strconv.Itoa(int(ports["client"])) != clientPort {
		t.Errorf("container port client %d, listen %s", ports["client"], cfg.Listen)
	}

	// Every file the pods read from the Secret: the config's relative
	// paths and the per-pod flags, for every ordinal.
	var secMount corev1.VolumeMount
	var secName string
	for _, m := range c.VolumeMounts {
		if v, ok := volumes[m.Name]; ok && v.Secret != nil {
			secMount, secName = m, v.Secret.SecretName
		}
	}
	cfgDir := path.Dir(cfgPath)
	var secretPaths []string
	for _, p := range []string{cfg.ClientTokensFile, cfg.TLSCert, cfg.TLSKey, cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA} {
		if p != "" {
			if !path.IsAbs(p) {
				p = path.Join(cfgDir, p)
			}
			secretPaths = append(secretPaths, p)
		}
	}
	for _, flag := range []string{"--tls-cert", "--tls-key", "--peer-tls-cert", "--peer-tls-key"} {
		if p := argAfter(c.Args, flag); p != "" {
			secretPaths = append(secretPaths, p)
		}
	}
	sec := o.secrets[secName]
	for _, p := range secretPaths {
		if path.Dir(p) != secMount.MountPath {
			t.Errorf("%s is not in the Secret's mount %s", p, secMount.MountPath)
			continue
		}
		for i := range wantReplicas {
			key := strings.ReplaceAll(path.Base(p), "$(POD_NAME)", fmt.Sprintf("%s-%d", sts.Name, i))
			secretHas("file "+p, secName, key)
		}
	}
	if (s.TLS == deploy.TLSPrivateCA) != (argAfter(c.Args, "--tls-cert") != "") {
		t.Errorf("TLS %s but --tls-cert %q", s.TLS, argAfter(c.Args, "--tls-cert"))
	}

	// Certificates: each pod's verifies for its DNS name under the CA.
	podHost := func(i int) string {
		return fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local", sts.Name, i, hl.Name, ns)
	}
	for _, pair := range []struct{ ca, cert string }{{deploy.CACert, deploy.ServerCert}, {deploy.ClusterCACert, deploy.NodeCert}} {
		caPEM, ok := sec.StringData[pair.ca]
		if !ok {
			continue
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			t.Fatalf("%s: no certificate", pair.ca)
		}
		for i := range wantReplicas {
			key := fmt.Sprintf("%s-%d-%s", sts.Name, i, pair.cert)
			blk, _ := pem.Decode([]byte(sec.StringData[key]))
			if blk == nil {
				t.Errorf("%s: no PEM certificate", key)
				continue
			}
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cert.Verify(x509.VerifyOptions{DNSName: podHost(i), Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Errorf("%s for %s: %v", key, podHost(i), err)
			}
		}
	}

	// Secrets only in the Secret's file: the ConfigMap and the StatefulSet
	// hold no token.
	for _, f := range b.Files {
		if strings.HasPrefix(f.Path, deploy.KubeDir+"/") && !f.Secret && !f.Mode.IsDir() {
			for _, tok := range secretTokens(sec) {
				if bytes.Contains(f.Data, []byte(tok)) {
					t.Errorf("%s holds a token", f.Path)
				}
			}
		} else if strings.HasPrefix(f.Path, deploy.KubeDir+"/") && f.Secret && f.Mode.Perm() != 0o600 {
			t.Errorf("%s: mode %04o, want 0600", f.Path, f.Mode.Perm())
		}
	}

	if !isCluster {
		if len(o.pdbs) != 0 {
			t.Errorf("a single server has a PodDisruptionBudget")
		}
		return
	}
	// The cluster: node-id from the pod's name, the peers are the pods at
	// their stable names, raft-advertise is the pod's own entry.
	if got := argAfter(c.Args, "--node-id"); got != "$(POD_NAME)" {
		t.Errorf("--node-id %q, want $(POD_NAME)", got)
	}
	var want []string
	for i := range wantReplicas {
		want = append(want, fmt.Sprintf("%s-%d=%s", sts.Name, i, net.JoinHostPort(podHost(i), strconv.Itoa(int(ports["raft"])))))
	}
	if !slices.Equal(cfg.Peers, want) {
		t.Errorf("peers %v, want %v", cfg.Peers, want)
	}
	expand := func(a string, i int) string {
		return strings.ReplaceAll(a, "$(POD_NAME)", fmt.Sprintf("%s-%d", sts.Name, i))
	}
	for i := range wantReplicas {
		if got := expand(argAfter(c.Args, "--node-id"), i) + "=" + expand(argAfter(c.Args, "--raft-advertise"), i); got != want[i] {
			t.Errorf("pod %d: node-id=raft-advertise %s, its peers entry %s", i, got, want[i])
		}
		if got, w := expand(argAfter(c.Args, "--advertise"), i), net.JoinHostPort(podHost(i), clientPort); got != w {
			t.Errorf("pod %d: --advertise %s, want %s", i, got, w)
		}
	}
	if _, raftPort, _ := net.SplitHostPort(cfg.RaftListen); raftPort != strconv.Itoa(int(ports["raft"])) {
		t.Errorf("raft-listen %s, container port raft %d", cfg.RaftListen, ports["raft"])
	}
	if len(o.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(o.pdbs))
	}
	pdb := o.pdbs[0]
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !matches(pdb.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("PodDisruptionBudget: maxUnavailable %v selector %v, want 1 of the pods %v", pdb.Spec.MaxUnavailable, pdb.Spec.Selector, podLabels)
	}
}

// secretTokens are the tokens of a bundle's Secret.
func secretTokens(sec *corev1.Secret) []string {
	var toks []string
	for _, key := range []string{deploy.TokensFile, deploy.AdminTokenFile} {
		for _, line := range strings.Split(sec.StringData[key], "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				toks = append(toks, line)
			}
		}
	}
	return toks
}

// matches reports whether selector selects labels.
func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// argAfter is the value after flag in args, "" without it.
func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

package deploy

import (
	"bytes"
	"fmt"
	"io/fs"
	"net"
	"path"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
)

// Kubernetes manifests of a bundle (Spec.Kubernetes), in KubeDir: a
// StatefulSet whose pods are the nodes (their ordinal names them), a
// headless Service for their stable DNS names, a client Service, a
// ConfigMap of the shared config, a Secret of the tokens and keys, a
// PodDisruptionBudget for a cluster and a kustomization.yaml that lists
// them ('kubectl apply -k k8s/'). They are rendered from the typed structs
// below with yaml.v3, as the rest of the bundle: the generator does not
// depend on the Kubernetes libraries; a test of a module of its own
// (internal/deploy/k8stest) decodes them with the Kubernetes API types.

// Kubernetes is what the manifests of a bundle need beside the Spec.
type Kubernetes struct {
	// Namespace the objects go to and their DNS names are in; "" means
	// DefaultKubeNamespace.
	Namespace string `json:"namespace,omitempty"`
	// Image is the container image of ticketingd the operator pushed (the
	// bundle's Dockerfile builds one); "" means DefaultKubeImage, a
	// placeholder to replace.
	Image string `json:"image,omitempty"`
}

// Defaults and names of the Kubernetes manifests.
const (
	DefaultKubeNamespace = "default"
	DefaultKubeImage     = "REGISTRY/ticketingd:VERSION"
	KubeDir              = "k8s"
	// KubeName names the StatefulSet (its pods are KubeName-0, -1, ...),
	// the client Service, the ConfigMap and the Secret; KubePeers the
	// headless Service of the pods' DNS names.
	KubeName    = "ticketing"
	KubePeers   = "ticketing-peers"
	KubeStorage = "1Gi"
	// The ConfigMap and the Secret are mounted side by side: a mount
	// inside the read-only ConfigMap volume would need a directory made
	// in it.
	kubeConfig = "/etc/ticketingd/config"
	kubeSecret = "/etc/ticketingd/secret"
	kubeData   = "/var/lib/ticketingd"
	kubeUser   = 65532
)

// checkKube checks s.Kubernetes (filled in with its defaults).
func checkKube(s *Spec, errs *FieldErrors) {
	k := s.Kubernetes
	if k == nil {
		return
	}
	if k.Namespace == "" {
		k.Namespace = DefaultKubeNamespace
	}
	if k.Image == "" {
		k.Image = DefaultKubeImage
	}
	if !dnsLabel(k.Namespace) {
		errs.add("kubernetes.namespace", "want a DNS label: 1 to 63 lower-case letters, digits or '-', starting and ending with a letter or digit")
	}
	if len(k.Image) > 512 || strings.ContainsFunc(k.Image, func(r rune) bool { return r <= ' ' || r > '~' }) {
		errs.add("kubernetes.image", "want an image reference without spaces or control characters")
	}
	switch {
	case s.Topology == Pair:
		errs.add("kubernetes", "a pair is not offered on Kubernetes: deploy a single server (Kubernetes restarts it) or a cluster")
	case s.Existing != nil:
		errs.add("kubernetes", "nodes added to a bundle are not offered on Kubernetes: scale the StatefulSet with 'ticketingd cluster add'")
	}
	if s.TLS == TLSOwn {
		errs.add("kubernetes", "your own TLS files are paths on the server machines: use a private CA (or no TLS) with Kubernetes")
	}
	if !s.AdminToken {
		errs.add("admin_token", "Kubernetes probes reach /healthz on the pod's address, and an admin listener off loopback needs the admin token")
	}
}

// dnsLabel reports whether s is an RFC 1123 label, as Kubernetes wants a
// namespace.
func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// Typed manifests: the fields the bundle sets, with Kubernetes' names.
type (
	kubeMeta struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels,omitempty"`
	}
	kubeObject struct {
		APIVersion string            `yaml:"apiVersion"`
		Kind       string            `yaml:"kind"`
		Metadata   kubeMeta          `yaml:"metadata"`
		Type       string            `yaml:"type,omitempty"`
		Data       map[string]string `yaml:"data,omitempty"`
		StringData map[string]string `yaml:"stringData,omitempty"`
		Spec       any               `yaml:"spec,omitempty"`
	}
	kubeSelector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	kubePort struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort string `yaml:"targetPort,omitempty"`
	}
	kubeServiceSpec struct {
		ClusterIP                string            `yaml:"clusterIP,omitempty"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses,omitempty"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []kubePort        `yaml:"ports"`
	}
	kubePDBSpec struct {
		MaxUnavailable int          `yaml:"maxUnavailable"`
		Selector       kubeSelector `yaml:"selector"`
	}
	kubeStatefulSetSpec struct {
		ServiceName          string         `yaml:"serviceName"`
		Replicas             int            `yaml:"replicas"`
		PodManagementPolicy  string         `yaml:"podManagementPolicy"`
		Selector             kubeSelector   `yaml:"selector"`
		Template             kubeTemplate   `yaml:"template"`
		VolumeClaimTemplates []kubeClaimTpl `yaml:"volumeClaimTemplates"`
	}
	kubeTemplate struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec kubePodSpec `yaml:"spec"`
	}
	kubePodSpec struct {
		TerminationGracePeriodSeconds int             `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               kubePodSecurity `yaml:"securityContext"`
		Containers                    []kubeContainer `yaml:"containers"`
		Volumes                       []kubeVolume    `yaml:"volumes"`
	}
	kubePodSecurity struct {
		RunAsUser    int  `yaml:"runAsUser"`
		RunAsGroup   int  `yaml:"runAsGroup"`
		FSGroup      int  `yaml:"fsGroup"`
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
	}
	kubeContainer struct {
		Name            string                `yaml:"name"`
		Image           string                `yaml:"image"`
		Args            []string              `yaml:"args"`
		Env             []kubeEnv             `yaml:"env"`
		Ports           []kubeContainerPort   `yaml:"ports"`
		ReadinessProbe  kubeProbe             `yaml:"readinessProbe"`
		LivenessProbe   kubeProbe             `yaml:"livenessProbe"`
		VolumeMounts    []kubeMount           `yaml:"volumeMounts"`
		SecurityContext kubeContainerSecurity `yaml:"securityContext"`
	}
	kubeContainerSecurity struct {
		AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	}
	kubeEnv struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef,omitempty"`
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef,omitempty"`
		} `yaml:"valueFrom"`
	}
	kubeContainerPort struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	}
	kubeProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
		InitialDelaySeconds int `yaml:"initialDelaySeconds,omitempty"`
		PeriodSeconds       int `yaml:"periodSeconds"`
		TimeoutSeconds      int `yaml:"timeoutSeconds"`
		FailureThreshold    int `yaml:"failureThreshold"`
	}
	kubeMount struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly,omitempty"`
	}
	kubeVolume struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap,omitempty"`
		Secret *struct {
			SecretName  string `yaml:"secretName"`
			DefaultMode int    `yaml:"defaultMode"`
		} `yaml:"secret,omitempty"`
	}
	kubeClaimTpl struct {
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Spec struct {
			AccessModes []string `yaml:"accessModes"`
			Resources   struct {
				Requests map[string]string `yaml:"requests"`
			} `yaml:"resources"`
		} `yaml:"spec"`
	}
)

// KubePodHost is the DNS name of pod i of the StatefulSet in namespace
// ns, through the headless Service.
func KubePodHost(i int, ns string) string {
	return fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local", KubeName, i, KubePeers, ns)
}

// kube plans the manifests in KubeDir: the pods of a cluster are its
// nodes, named by the pods (ticketing-0, ...), however the Spec's nodes
// are named, with certificates for their DNS names from the bundle's CAs,
// its tokens and a cluster-id of their own.
func (p *planner) kube() error {
	k := *p.s.Kubernetes
	ns := k.Namespace
	cluster := p.s.Topology == Cluster
	replicas := 1
	if cluster {
		replicas = len(p.l.nodes)
	}
	port, raftPort, adminPort := p.s.Port, p.s.PeerPort, p.s.AdminPort
	if !cluster {
		port, _ = strconv.Atoi(p.l.single.port)
	}
	labels := map[string]string{"app.kubernetes.io/name": "ticketingd", "app.kubernetes.io/instance": KubeName}
	meta := func(name string) kubeMeta { return kubeMeta{Name: name, Namespace: ns, Labels: labels} }

	// The admin token without a newline: the env var ADMIN_TOKEN takes
	// the value as it is.
	secret := map[string]string{TokensFile: string(tokensBody(p.tok, string(p.s.Topology))), AdminTokenFile: p.adm}
	clientSvc := []string{KubeName, KubeName + "." + ns, KubeName + "." + ns + ".svc", KubeName + "." + ns + ".svc.cluster.local"}
	var peers []string
	var initial []server.Peer
	var addrs []string
	for i := range replicas {
		host := KubePodHost(i, ns)
		id := fmt.Sprintf("%s-%d", KubeName, i)
		link := net.JoinHostPort(host, strconv.Itoa(raftPort))
		peers = append(peers, id+"="+link)
		initial = append(initial, server.Peer{ID: id, Address: link})
		addrs = append(addrs, net.JoinHostPort(host, strconv.Itoa(port)))
		issue := func(ca *pki.CA, usage pki.Kind, hosts []string, cert, key string) error {
			kp, err := ca.Issue(usage, hosts, certLife)
			if err != nil {
				return err
			}
			kd, err := kp.KeyPEM()
			if err != nil {
				return err
			}
			secret[id+"-"+cert], secret[id+"-"+key] = string(kp.CertPEM()), string(kd)
			return nil
		}
		if p.cas.clientCA != nil && p.s.TLS == TLSPrivateCA {
			if err := issue(p.cas.clientCA, pki.Server, append([]string{host}, clientSvc...), ServerCert, ServerKey); err != nil {
				return err
			}
		}
		if cluster && p.cas.clusterCA != nil {
			if err := issue(p.cas.clusterCA, pki.Node, []string{host}, NodeCert, NodeKey); err != nil {
				return err
			}
		}
	}
	if p.cas.clientCA != nil && p.s.TLS == TLSPrivateCA {
		secret[CACert] = string(p.cas.clientCA.CertPEM())
	}
	if cluster && p.cas.clusterCA != nil {
		secret[ClusterCACert] = string(p.cas.clusterCA.CertPEM())
	}

	// The config every pod shares; what differs (node-id, advertise
	// addresses, certificates) are flags from the pod's name.
	cfg := Config{Listen: ":" + strconv.Itoa(port), DataDir: kubeData + "/" + DataDir, ClientTokensFile: kubeSecret + "/" + TokensFile,
		AdminListen: ":" + strconv.Itoa(adminPort), ConsoleKeys: p.s.ConsoleKeys, TokenStart: p.s.TokenStart,
		LogLevel: "info", LogFormat: "json", ShutdownTimeout: 10 * time.Second}
	clusterID := ""
	if cluster {
		clusterID = server.NewClusterIDFor(initial)
		cfg.Cluster, cfg.ClusterID, cfg.InitialState, cfg.RaftListen, cfg.Peers = true, clusterID, "new", ":"+strconv.Itoa(raftPort), peers
		if p.cas.clusterCA != nil {
			cfg.PeerTLSCA = kubeSecret + "/" + ClusterCACert
		}
	}
	head := "# ticketingd configuration of the Kubernetes pods, written by " + p.writtenBy("") + ".\n" +
		"# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.\n" +
		"# The StatefulSet's args add what differs per pod: node-id, node-name, advertise,\n" +
		"# raft-advertise, the certificates and the admin token (from the Secret)."
	conf, err := configDoc{cfg: cfg, head: head}.render()
	if err != nil {
		return err
	}

	var files [][2]string // name, YAML
	add := func(name, comment string, secretFile bool, objs ...kubeObject) error {
		var buf bytes.Buffer
		buf.WriteString("# " + comment + ", written by " + p.writtenBy("") + ".\n")
		for i, o := range objs {
			if i > 0 {
				buf.WriteString("---\n")
			}
			enc := yaml.NewEncoder(&buf)
			enc.SetIndent(2)
			if err := enc.Encode(o); err != nil {
				return fmt.Errorf("deploy: encode %s: %w", name, err)
			}
			if err := enc.Close(); err != nil {
				return fmt.Errorf("deploy: encode %s: %w", name, err)
			}
		}
		mode := 0o644
		if secretFile {
			mode = 0o600
		}
		p.file(path.Join(KubeDir, name), fs.FileMode(mode), buf.Bytes(), secretFile)
		files = append(files, [2]string{name, comment})
		return nil
	}

	if err := add("secret.yaml", "Secret of the tokens, keys and certificates (mode 0600: it holds them)", true,
		kubeObject{APIVersion: "v1", Kind: "Secret", Metadata: meta(KubeName), Type: "Opaque", StringData: secret}); err != nil {
		return err
	}
	if err := add("configmap.yaml", "ConfigMap of the config every pod shares", false,
		kubeObject{APIVersion: "v1", Kind: "ConfigMap", Metadata: meta(KubeName), Data: map[string]string{ConfigFile: string(conf)}}); err != nil {
		return err
	}
	clientPorts := []kubePort{{Name: "client", Port: port, TargetPort: "client"}}
	peerPorts := []kubePort{{Name: "client", Port: port, TargetPort: "client"}}
	if cluster {
		peerPorts = append(peerPorts, kubePort{Name: "raft", Port: raftPort, TargetPort: "raft"})
	}
	if err := add("services.yaml", "Services: the headless one names the pods, the other is for clients", false,
		kubeObject{APIVersion: "v1", Kind: "Service", Metadata: meta(KubePeers),
			Spec: kubeServiceSpec{ClusterIP: "None", PublishNotReadyAddresses: true, Selector: labels, Ports: peerPorts}},
		kubeObject{APIVersion: "v1", Kind: "Service", Metadata: meta(KubeName),
			Spec: kubeServiceSpec{Selector: labels, Ports: clientPorts}}); err != nil {
		return err
	}
	if err := add("statefulset.yaml", "StatefulSet of the ticketingd pods", false,
		kubeObject{APIVersion: "apps/v1", Kind: "StatefulSet", Metadata: meta(KubeName),
			Spec: p.kubeStatefulSet(replicas, port, raftPort, adminPort, labels, secret)}); err != nil {
		return err
	}
	if cluster {
		if err := add("pdb.yaml", "PodDisruptionBudget: one pod down at a time keeps the quorum", false,
			kubeObject{APIVersion: "policy/v1", Kind: "PodDisruptionBudget", Metadata: meta(KubeName),
				Spec: kubePDBSpec{MaxUnavailable: 1, Selector: kubeSelector{MatchLabels: labels}}}); err != nil {
			return err
		}
	}
	var kust strings.Builder
	kust.WriteString("# The manifests of the bundle: kubectl apply -k " + KubeDir + "/\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n")
	for _, f := range files {
		kust.WriteString("  - " + f[0] + "\n")
	}
	p.file(path.Join(KubeDir, "kustomization.yaml"), 0o644, []byte(kust.String()), false)

	// The clients' URL inside the Kubernetes cluster: every pod's address.
	u := "ticketing://TOKEN@" + strings.Join(addrs, ",")
	if p.s.TLS == TLSPrivateCA {
		u += "?ca=/path/to/ca.pem"
	}
	if clusterID != "" {
		if strings.Contains(u, "?") {
			u += "&cluster=" + clusterID
		} else {
			u += "?cluster=" + clusterID
		}
	}
	p.kubeURL = u
	if k.Image == DefaultKubeImage {
		p.b.Warnings = append(p.b.Warnings, fmt.Sprintf("the StatefulSet runs the image %s, a placeholder: push an image built with the bundle's Dockerfile and name it in %s/statefulset.yaml",
			DefaultKubeImage, KubeDir))
	}
	return nil
}

// kubeStatefulSet is the StatefulSet's spec: Parallel pod management, so
// that every node of a new cluster starts and answers its peers before
// any is ready; per-pod flags from the pod's name ($(POD_NAME)); probes on
// the admin listener's /healthz; the data dir on a volume claim per pod.
func (p *planner) kubeStatefulSet(replicas, port, raftPort, adminPort int, labels, secret map[string]string) kubeStatefulSetSpec {
	ns := p.s.Kubernetes.Namespace
	cluster := p.s.Topology == Cluster
	self := "$(POD_NAME)." + KubePeers + "." + ns + ".svc.cluster.local"
	args := []string{"serve", "--config", kubeConfig + "/" + ConfigFile, "--admin-token", "$(ADMIN_TOKEN)", "--node-name", "$(POD_NAME)"}
	if cluster {
		args = append(args, "--node-id", "$(POD_NAME)",
			"--advertise", net.JoinHostPort(self, strconv.Itoa(port)),
			"--raft-advertise", net.JoinHostPort(self, strconv.Itoa(raftPort)))
	}
	if _, ok := secret[KubeName+"-0-"+ServerCert]; ok {
		args = append(args, "--tls-cert", kubeSecret+"/$(POD_NAME)-"+ServerCert, "--tls-key", kubeSecret+"/$(POD_NAME)-"+ServerKey)
	}
	if _, ok := secret[KubeName+"-0-"+NodeCert]; ok {
		args = append(args, "--peer-tls-cert", kubeSecret+"/$(POD_NAME)-"+NodeCert, "--peer-tls-key", kubeSecret+"/$(POD_NAME)-"+NodeKey)
	}
	var podName, adminTok kubeEnv
	podName.Name = "POD_NAME"
	podName.ValueFrom.FieldRef = &struct {
		FieldPath string `yaml:"fieldPath"`
	}{"metadata.name"}
	adminTok.Name = "ADMIN_TOKEN"
	adminTok.ValueFrom.SecretKeyRef = &struct {
		Name string `yaml:"name"`
		Key  string `yaml:"key"`
	}{KubeName, AdminTokenFile}

	probe := func(period, failures int) kubeProbe {
		var pr kubeProbe
		pr.HTTPGet.Path, pr.HTTPGet.Port = "/healthz", "admin"
		pr.PeriodSeconds, pr.TimeoutSeconds, pr.FailureThreshold = period, 3, failures
		return pr
	}
	c := kubeContainer{Name: "ticketingd", Image: p.s.Kubernetes.Image, Args: args, Env: []kubeEnv{podName, adminTok},
		Ports:          []kubeContainerPort{{"client", port}, {"admin", adminPort}},
		ReadinessProbe: probe(5, 3), LivenessProbe: probe(10, 6),
		VolumeMounts: []kubeMount{{Name: "config", MountPath: kubeConfig, ReadOnly: true},
			{Name: "secret", MountPath: kubeSecret, ReadOnly: true}, {Name: "data", MountPath: kubeData}}}
	if cluster {
		c.Ports = append(c.Ports, kubeContainerPort{"raft", raftPort})
	}
	c.SecurityContext.ReadOnlyRootFilesystem = true
	c.SecurityContext.Capabilities.Drop = []string{"ALL"}
	var tpl kubeTemplate
	tpl.Metadata.Labels = labels
	cfgVol := kubeVolume{Name: "config", ConfigMap: &struct {
		Name string `yaml:"name"`
	}{KubeName}}
	secVol := kubeVolume{Name: "secret", Secret: &struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode int    `yaml:"defaultMode"`
	}{KubeName, 0o440}}
	tpl.Spec = kubePodSpec{TerminationGracePeriodSeconds: 30,
		SecurityContext: kubePodSecurity{RunAsUser: kubeUser, RunAsGroup: kubeUser, FSGroup: kubeUser, RunAsNonRoot: true},
		Containers:      []kubeContainer{c}, Volumes: []kubeVolume{cfgVol, secVol}}
	var claim kubeClaimTpl
	claim.Metadata.Name = "data"
	claim.Spec.AccessModes = []string{"ReadWriteOnce"}
	claim.Spec.Resources.Requests = map[string]string{"storage": KubeStorage}
	return kubeStatefulSetSpec{ServiceName: KubePeers, Replicas: replicas, PodManagementPolicy: "Parallel",
		Selector: kubeSelector{MatchLabels: labels}, Template: tpl, VolumeClaimTemplates: []kubeClaimTpl{claim}}
}

// kubeReadme is the README's section on the Kubernetes manifests.
func (p *planner) kubeReadme() string {
	k := p.s.Kubernetes
	var w strings.Builder
	w.WriteString("\n## Start it on Kubernetes\n\n")
	fmt.Fprintf(&w, "`%s/` holds the manifests, for the namespace `%s`. Build the image as for Docker\n", KubeDir, k.Namespace)
	fmt.Fprintf(&w, "Compose, push it to a registry your cluster pulls from, and name it in\n`%s/statefulset.yaml` (now `%s`). Then:\n\n```sh\n", KubeDir, k.Image)
	fmt.Fprintf(&w, "kubectl apply -k %s/\n```\n\n", KubeDir)
	fmt.Fprintf(&w, "`%s/secret.yaml` holds the tokens and keys (mode 0600): apply it, keep it out of\nrepositories. ", KubeDir)
	if p.s.Topology == Cluster {
		fmt.Fprintf(&w, "The pods %s-0 ... %s-%d are the nodes, their names the node IDs; they\n", KubeName, KubeName, len(p.l.nodes)-1)
		w.WriteString("start together (Parallel) and bootstrap the cluster once every one has answered.\n")
	}
	fmt.Fprintf(&w, "Clients in the Kubernetes cluster connect with\n\n```\n%s\n```\n\n", p.kubeURL)
	w.WriteString("with a token of `client-tokens` for TOKEN")
	if p.s.TLS == TLSPrivateCA {
		w.WriteString(" and this bundle's `ca.pem`")
	}
	w.WriteString(". See docs/kubernetes.md in the repository.\n")
	return w.String()
}

package peerurls

// The types below mirror, field for field and tag for tag, the JSON of
// druid#1438's spec.etcd.additionalAdvertisedURLs (druid API types
// AdditionalAdvertiseURLsSpec, AdditionalURLsSpec and MemberURLs, merged on
// druid's master, in no release yet). The druid API this module pins,
// v0.38.1, has no Go type for the field, so decoding an Etcd into it drops
// the field; ReadJSON reads it from the object's JSON with these instead.
// Once the pin moves to a druid release with #1438, druid's own types take
// their place and ReadJSON reads the typed field.

// AdditionalAdvertiseURLsSpec is druid#1438's
// spec.etcd.additionalAdvertisedURLs: extra per-member client and peer URLs,
// each list on its own.
type AdditionalAdvertiseURLsSpec struct {
	// ClientURLs are extra client URLs (etcd's advertise-client-urls).
	// druid-stretch does not read them.
	ClientURLs *AdditionalURLsSpec `json:"clientURLs,omitempty"`
	// PeerURLs are extra peer URLs (initial-advertise-peer-urls and
	// initial-cluster).
	PeerURLs *AdditionalURLsSpec `json:"peerURLs,omitempty"`
}

// AdditionalURLsSpec is one list of druid#1438's per-member URLs.
type AdditionalURLsSpec struct {
	// OverrideDefaultURL, when true, makes every member listed in Members
	// advertise only its listed URLs, without druid's in-cluster URL.
	// Members without an entry keep the in-cluster URL. Unset means false.
	OverrideDefaultURL *bool `json:"overrideDefaultURL,omitempty"`
	// Members are the URLs per member.
	Members []MemberURLs `json:"members"`
}

// MemberURLs are druid#1438's URLs of one member.
type MemberURLs struct {
	// Name is the etcd member name, [<memberNamePrefix>-]<etcd name>-<ordinal>:
	// druid looks the entry up by GetMemberName(prefix, pod name).
	Name string `json:"name"`
	// URLs are the member's additional URLs.
	URLs []string `json:"urls"`
}

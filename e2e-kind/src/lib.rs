//! Test support: the local control plane, cloud fakes and the end-to-end suite.

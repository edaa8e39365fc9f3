"""The outcome reward (paper Eq. 3): answer extraction, equivalence, the verifier processes."""

package memory

// A record's strings and result live in its shard's text, one record's
// after another's, in the order of the text* field numbers: a write puts
// the record's text anew at the end, and what it replaced becomes waste,
// until the shard compacts its text (compact). Every function here is
// called with sh.mu held, and a slice of the text it returns is valid only
// until the next write.

// field is one of rec's text fields.
func (sh *shard) field(rec *record, f int) []byte {
	off := rec.off
	for i := range f {
		off += int(rec.lens[i])
	}
	end := off + int(rec.lens[f])
	return sh.text[off:end:end]
}

// span is the text of fields from to to (exclusive), one after another.
func (sh *shard) span(rec *record, from, to int) []byte {
	off := rec.off
	for i := range from {
		off += int(rec.lens[i])
	}
	end := off
	for i := from; i < to; i++ {
		end += int(rec.lens[i])
	}
	return sh.text[off:end:end]
}

func (rec *record) textLen() int {
	n := 0
	for _, l := range rec.lens {
		n += int(l)
	}
	return n
}

// is reports whether rec is the record of (scope, key).
func (sh *shard) is(rec *record, scope, key string) bool {
	return string(sh.field(rec, textKey)) == key && string(sh.field(rec, textScope)) == scope
}

// newText gives rec the text of a new record: its identity and its
// claimer's, no outcome.
func (sh *shard) newText(rec *record, scope, key, fingerprint, messageUUID string) {
	sh.waste += rec.textLen()
	rec.off = len(sh.text)
	rec.lens = [textFields]uint32{uint32(len(scope)), uint32(len(key)), uint32(len(fingerprint)), uint32(len(messageUUID))}
	rec.hasResult = false
	sh.text = append(append(append(append(sh.text, scope...), key...), fingerprint...), messageUUID...)
	sh.compactIfWasteful()
}

// claimText sets rec's claimer, and its fingerprint unless that is empty.
func (sh *shard) claimText(rec *record, fingerprint, messageUUID string) {
	head := sh.span(rec, textScope, textFingerprint)
	oldFingerprint := sh.field(rec, textFingerprint)
	tail := sh.span(rec, textErrorKind, textFields)
	sh.waste += rec.textLen()
	rec.off = len(sh.text)
	sh.text = append(sh.text, head...)
	if fingerprint != "" {
		rec.lens[textFingerprint] = uint32(len(fingerprint))
		sh.text = append(sh.text, fingerprint...)
	} else {
		sh.text = append(sh.text, oldFingerprint...)
	}
	rec.lens[textMessageUUID] = uint32(len(messageUUID))
	sh.text = append(append(sh.text, messageUUID...), tail...)
	sh.compactIfWasteful()
}

// outcomeText sets rec's outcome: its error and its result. A record whose
// text is the last of the shard's (the one just claimed, usually) has its
// outcome replaced in place.
func (sh *shard) outcomeText(rec *record, kind, message string, result []byte) {
	headLen := len(sh.span(rec, textScope, textErrorKind))
	if rec.off+rec.textLen() == len(sh.text) {
		sh.text = sh.text[:rec.off+headLen]
	} else {
		head := sh.span(rec, textScope, textErrorKind)
		sh.waste += rec.textLen()
		rec.off = len(sh.text)
		sh.text = append(sh.text, head...)
	}
	rec.lens[textErrorKind] = uint32(len(kind))
	rec.lens[textErrorMessage] = uint32(len(message))
	rec.lens[textResult] = uint32(len(result))
	rec.hasResult = result != nil
	sh.text = append(append(append(sh.text, kind...), message...), result...)
	sh.compactIfWasteful()
}

// Text is compacted once its waste is more than half of it, and more than
// minCompactWaste bytes: each compaction copies the live text, so its cost
// is paid for by the waste written since the last one.
const minCompactWaste = 4 << 10

func (sh *shard) compactIfWasteful() {
	if sh.waste > minCompactWaste && 2*sh.waste > len(sh.text) {
		sh.compact()
	}
}

// compact copies the live records' text to a new slice, without the waste.
func (sh *shard) compact() {
	live := len(sh.text) - sh.waste
	text := make([]byte, 0, live+live/4)
	for i := range sh.slots {
		rec := &sh.slots[i]
		if !rec.used {
			continue
		}
		off := len(text)
		text = append(text, sh.text[rec.off:rec.off+rec.textLen()]...)
		rec.off = off
	}
	sh.text, sh.waste = text, 0
}

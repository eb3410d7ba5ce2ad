/* unicode.h - UTF-8 decoding/encoding, the lossy UTF-8 repair HF tokenizers applies, the GPT-2
 * byte-level alphabet, and the Unicode character classes the pre-tokenizers need. */
#ifndef PAGODA_UNICODE_H
#define PAGODA_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define UNICODE_REPLACEMENT 0xFFFDu

/* Decodes one code point at S (N > 0 bytes). Returns its length 1..4 and sets *CP, or 0 when
 * the bytes at S do not start a valid UTF-8 sequence (overlong, surrogate, truncated...). */
int unicode_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Writes CP as UTF-8 into OUT (>= 4 bytes); returns the length. */
int unicode_utf8_encode(uint32_t cp, char *out);
/* Length of the sequence announced by lead byte B (1 for ASCII and for invalid leads). */
int unicode_utf8_len(uint8_t b);
/* 1 if all N bytes are valid UTF-8. */
int unicode_utf8_valid(const char *s, size_t n);
/* Copies N bytes into OUT (room for 3 * N bytes) with every maximal invalid subpart replaced by
 * U+FFFD (what Rust's String::from_utf8_lossy does); returns the output length. */
size_t unicode_utf8_repair(const char *s, size_t n, char *out);

/* Streaming form of unicode_utf8_repair: holds at most 3 bytes of an incomplete sequence. */
struct utf8_stream {
  uint8_t pending[4];
  int num_pending;
};
/* Feeds byte B; appends complete output (at most 7 bytes) to OUT and returns its length. */
int utf8_stream_push(struct utf8_stream *s, uint8_t b, char *out);
/* Ends the stream: an incomplete sequence becomes U+FFFD. Returns bytes written (0 or 3). */
int utf8_stream_flush(struct utf8_stream *s, char *out);

/* GPT-2 byte-level alphabet: byte B is written as code point unicode_byte_to_cp(B), and
 * unicode_cp_to_byte inverts it (-1 for code points outside the alphabet). */
uint32_t unicode_byte_to_cp(uint8_t b);
int unicode_cp_to_byte(uint32_t cp);

/* Character classes as HF tokenizers (Rust char methods) define them. */
int unicode_is_whitespace(uint32_t cp); /* White_Space */
int unicode_is_numeric(uint32_t cp);    /* general category N* */
int unicode_is_punct(uint32_t cp);      /* category P* or ASCII punctuation */
int unicode_is_alnum(uint32_t cp);      /* L* or N* */
int unicode_is_mark(uint32_t cp);      /* category M* (Mn, Mc, Me) */
/* A word character as the Rust regex crate's \w (HF's single_word boundary): L*, Nl, M*, Nd,
 * Pc (so '_') and the joiners U+200C/U+200D. Other_Alphabetic symbols (So, e.g. circled
 * letters) are not included: utf8proc has no property table for them. */
int unicode_is_word(uint32_t cp);

#endif

"""Status pages served by the API itself: HTML shells and hand-written ES modules (no build step).

The pages hold no data: their scripts read the JSON API with the key the user enters once
(kept in sessionStorage), so they see exactly what that key's project sees."""

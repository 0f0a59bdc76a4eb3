"""Which candidates a seat's certification evaluates: the search a seat gets
(`seat_search`), the searches (`searches`) and the ranking from earlier seats (`ranked`)."""
